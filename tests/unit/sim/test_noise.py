"""Service-time noise (``target.sim.prefill_noise_sigma``): one lognormal factor of mean 1
per request on its prefill compute, drawn from the run's seed."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.virtual import plan_run
from sessiongen.errors import UserError
from sessiongen.experiment.script import turn_key as request_key
from sessiongen.sim.noise import PrefillNoise
from tests.support.paths import ROOT


def test_factors_have_mean_one_and_the_given_spread() -> None:
    noise = PrefillNoise(0.3, (7, 1))
    factors = np.array([noise.draw() for _ in range(60_000)])
    assert factors.mean() == pytest.approx(1.0, abs=0.01)
    assert np.log(factors).std() == pytest.approx(0.3, abs=0.01)
    again = PrefillNoise(0.3, (7, 1))
    assert [again.draw() for _ in range(5000)] == factors[:5000].tolist()
    other = PrefillNoise(0.3, (7, 2))
    assert [other.draw() for _ in range(10)] != factors[:10].tolist()


def test_a_keyed_factor_depends_on_its_key_only() -> None:
    """The planner and the served simulator give a turn the same factor, whatever order
    the turns reach the engine in and whatever keyless requests came between."""
    keys = [request_key(7, block, session, turn) for block in (0, 1) for session in range(50)
            for turn in range(1, 7)]  # fmt: skip
    first = PrefillNoise(0.3, 1)
    forward = {key: first.factor(key) for key in keys}
    second = PrefillNoise(0.3, 99)  # another stream for keyless requests
    backward = {}
    for key in reversed(keys):
        second.factor(None)
        backward[key] = second.factor(key)
    assert backward == forward
    assert len(set(forward.values())) == len(keys)
    assert PrefillNoise(0.6, 1).factor(keys[0]) != forward[keys[0]]
    assert PrefillNoise(0.0, 1).factor(keys[0]) == 1.0


def test_keyed_factors_have_mean_one_and_the_given_spread() -> None:
    noise = PrefillNoise(0.3, 0)
    factors = np.array([noise.factor(request_key(3, 0, i, 1)) for i in range(60_000)])
    assert factors.mean() == pytest.approx(1.0, abs=0.01)
    assert np.log(factors).std() == pytest.approx(0.3, abs=0.01)
    assert np.log(factors).mean() == pytest.approx(-0.045, abs=0.005)  # -sigma^2 / 2


def test_no_noise_is_exactly_one_and_draws_nothing() -> None:
    noise = PrefillNoise(0.0, 1)
    assert {noise.draw() for _ in range(100)} == {1.0}
    assert noise._rng is None
    with pytest.raises(ValueError, match="prefill_noise_sigma"):
        PrefillNoise(-0.1, 1)


def test_a_negative_sigma_in_a_scenario_names_the_field() -> None:
    with pytest.raises(UserError, match="prefill_noise_sigma"):
        scenario.load(ROOT / "scenarios" / "smoke.toml", ["target.sim.prefill_noise_sigma=-1"])


def _turn_times(sigma: float, seed: int) -> pl.DataFrame:
    """decision-cpu's 12k sessions, alternate, two in flight, pool on, planned in shape
    mode (prompt lengths do not depend on the seed)."""
    sc = scenario.load(
        ROOT / "scenarios" / "decision-cpu.toml",
        [
            "target.kind=sim",
            "target.sim.profile=builtin:cpu-tiny",
            "sessions.initial_context_tokens=[12000]",
            'placement.policies=["alternate"]',
            "load.levels=[2]",
            f"target.sim.prefill_noise_sigma={sigma}",
            f"seed={seed}",
        ],
    )
    rows = plan_run(sc, run_id="noise", tokens="shape").requests
    return rows.filter(~pl.col("warmup")).select("cache", "session_index", "turn", "ttft_s")


def test_without_noise_replicates_plan_the_same_times_and_with_it_they_differ() -> None:
    """A replicate of a plan is another seed. Without noise, sessions of the same lengths
    at zero think time give every replicate the same times to the bit, so the plan's
    interval holds none of the timing variation a real pair shows (which decides who
    queues behind whose 12k prefill: bench/heldout_decision.py). With noise the
    replicates differ, and one seed still gives the same records twice."""
    assert _turn_times(0.0, 31).equals(_turn_times(0.0, 32))
    noisy = _turn_times(0.1, 31)
    assert noisy.equals(_turn_times(0.1, 31))
    assert not noisy.equals(_turn_times(0.1, 32))
    assert not noisy.equals(_turn_times(0.0, 31))
    # mean 1: the cold turns' mean time stays where the fitted costs put it
    cold = pl.col("turn") == 1
    quiet = _turn_times(0.0, 31).filter(cold)["ttft_s"].mean()
    assert noisy.filter(cold)["ttft_s"].mean() == pytest.approx(quiet, rel=0.15)
