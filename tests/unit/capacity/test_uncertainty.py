"""A planned gain's interval: sampling, parameter draws and model error combined
(sessiongen.capacity.uncertainty), identical replicates counted once, and the evidence
every verdict names (sessiongen.capacity.evidence)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.analysis.payoff import UNFITTED
from sessiongen.capacity import plan
from sessiongen.capacity.evidence import evidence
from sessiongen.capacity.modelerror import default_model_error
from sessiongen.capacity.uncertainty import combine, predictive_half_width, regime
from sessiongen.records.run import load_run
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios/smoke.toml"


def test_independent_parts_add_in_variance_on_the_log_scale() -> None:
    sampling = 0.1
    c = combine(
        2.0, 2.0 * math.exp(-sampling), 2.0 * math.exp(sampling), [2.0], drawn=False, sigma=0.2
    )
    half = math.sqrt(sampling**2 + (1.959963984540054 * 0.2) ** 2)
    assert c.low == pytest.approx(2.0 * math.exp(-half))
    assert c.high == pytest.approx(2.0 * math.exp(half))
    assert c.share_parameters == 0.0
    assert c.share_sampling + c.share_model == pytest.approx(1.0)
    assert "taken as exact" in c.note


def test_no_sampling_variation_still_gives_the_model_error_and_says_so() -> None:
    c = combine(1.12, 1.12, 1.12, [1.12], drawn=False, sigma=0.15)
    assert c.low < 1.12 < c.high  # never a zero-width interval shown as certainty
    assert c.share_model == pytest.approx(1.0)
    assert "no sampling variation; the interval is the model's error" in c.note


def test_the_parameter_part_is_a_predictive_interval_over_the_draws() -> None:
    """Over many seeded trials, the interval from five draws' log gains holds a sixth
    draw about 95% of the time (the t quantile and sqrt(1 + 1/R) make it predictive;
    a confidence interval of the mean would hold far fewer)."""
    rng = np.random.default_rng(3)
    held = 0
    trials = 4000
    for _ in range(trials):
        logs = rng.normal(0.4, 0.3, 6)
        h = predictive_half_width(logs[:5])
        held += abs(logs[5] - logs[:5].mean()) <= h
    assert 0.93 <= held / trials <= 0.97


def test_spread_draws_widen_the_interval_to_hold_every_replicate() -> None:
    gains = [1.3, 1.6, 2.1, 1.1, 1.8]
    c = combine(1.5, 1.45, 1.55, gains, drawn=True, sigma=0.0)
    assert c.low <= min(gains) and c.high >= max(gains)
    assert c.share_parameters > 0.9


def test_regimes() -> None:
    assert regime(closed=True, level=1.0) == "one_in_flight"
    assert regime(closed=True, level=2.0) == "loaded"
    assert regime(closed=False, level=0.5) == "loaded"  # in flight not measured
    assert regime(closed=False, level=4.0, busiest=1.0) == "one_in_flight"  # a quiet trace
    assert regime(closed=False, level=4.0, busiest=3.0) == "loaded"


def test_the_builtin_profiles_evidence() -> None:
    study = evidence(scenario.load(SMOKE))  # no profile: the simulator's defaults
    assert study.profile == "builtin:study" and not study.fitted
    shipped = default_model_error()
    assert study.model_error == {r: shipped[r] for r in ("one_in_flight", "loaded")}
    tiny = evidence(scenario.load(SMOKE, ["target.sim.profile=builtin:cpu-tiny"]))
    assert tiny.profile == "builtin:cpu-tiny" and tiny.fitted
    assert tiny.runs and tiny.date


def _whatif(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "whatif.parquet").sort("placement", "load_level")


def test_identical_replicates_give_the_interval_of_one(tmp_path: Path) -> None:
    """smoke plans the same records whatever the seed (a closed loop, no noise, no
    draws): three replicates are one, not three times the sessions."""
    one = _whatif(plan.plan(SMOKE, runs_dir=tmp_path / "1", seeds=1, sensitivity=False))
    three = _whatif(plan.plan(SMOKE, runs_dir=tmp_path / "3", seeds=3, sensitivity=False))
    assert three["distinct_replicates"].to_list() == [1] * three.height
    for col in ("session_gain", "session_gain_low", "session_gain_high", "sessions"):
        assert three[col].to_list() == one[col].to_list(), col
    assert three["verdict"].to_list() == ["not enough data"] * three.height  # 2 sessions
    assert all(UNFITTED in v for v in three["verdict_text"].to_list())


def test_spread_parameter_draws_give_an_interval_holding_each_replicates_gain(
    tmp_path: Path,
) -> None:
    """A profile whose draws spread the prefill cost +-40%: each replicate's own session
    gain (its run folder reduced alone) lies inside the pooled cell's interval."""
    profile = tmp_path / "spread.toml"
    lines = ["[target.sim]", "prefill_s_per_ktok = 0.136", "", "[fit]", "fitted = true"]
    for scale in (0.6, 0.8, 1.2, 1.4, 0.7):
        lines += ["[[fit.draw]]", f"prefill_s_per_ktok = {0.136 * scale!r}"]
    profile.write_text("\n".join(lines) + "\n")
    sets = [f"target.sim.profile={profile}", "sessions.count=6"]
    out = plan.plan(SMOKE, overrides=sets, runs_dir=tmp_path, seeds=6, sensitivity=False)
    whatif = _whatif(out)
    assert whatif["parameter_draws"].to_list() == [5]
    assert whatif["distinct_replicates"].to_list() == [6]
    assert whatif["share_parameters"][0] > 0
    low, high = whatif["session_gain_low"][0], whatif["session_gain_high"][0]
    gains = [
        plan.whatif_rows(load_run(d))["session_gain"][0]
        for d in sorted((out / "configs").iterdir())
    ]
    assert len(gains) == 6 and max(gains) / min(gains) > 1.05  # the draws moved the gain
    assert all(low <= g <= high for g in gains), (low, high, gains)
