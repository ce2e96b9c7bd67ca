"""Runs and trend stores written by earlier versions still load, report and trend.

``tests/fixtures/v1`` holds two run folders of ``scenarios/smoke.toml`` on the simulated
pair (one with the needle probe, one with ``sessions.probe=equivalence``) and the trend
store they were added to, all written by sessiongen at commit 757e342, before the
package was restructured. The run-folder and store formats must keep reading them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.analysis import console_table, load_run, run_summary
from sessiongen.report import write_report
from sessiongen.trend import trend_add, trend_check
from tests.support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "v1"
RUNS = sorted((FIXTURES / "runs").iterdir())


@pytest.mark.parametrize("run_dir", RUNS, ids=[p.name for p in RUNS])
def test_old_runs_load_and_report(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    run = load_run(copy)
    assert run.simulated and run.time_scale == pytest.approx(0.05)
    assert run.requests.height == 4 * 2 * 3  # four blocks, two sessions, three turns
    assert "alternate" in console_table(run)
    summary = run_summary(run)
    assert set(summary["cache"].to_list()) == {"off", "on"}
    report = write_report(copy)
    text = report.read_text()
    assert "SIMULATED" in text and "Headline" in text
    # No prompt digests before schema 2: prompts are matched by block salt, session and
    # turn (every block of these runs shared one salt), and the report says so.
    assert "Prompts were matched by block salt, session and turn" in text
    assert "passed: all 12 ON answers" in text and summary["cache_failures"].sum() == 0


def test_old_store_checks_and_takes_old_runs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", store)
    result = trend_check(store)
    assert result.series > 0
    assert result.findings.filter(pl.col("metric") == "cache_failures").is_empty()
    assert sum(result.groups.values()) == 2  # one night in each of two folders
    # The same runs again: already stored, nothing is written.
    assert trend_add(RUNS, store) == []
    stored = pl.concat([pl.read_parquet(p) for p in sorted(store.glob("*/*.parquet"))])
    assert stored["store_version"].unique().to_list() == [1]


def test_scenario_digests_survive_fields_added_later() -> None:
    """A scenario that uses none of the newer fields keeps its digest, so a nightly trend
    store keeps adding to the same folder's history."""
    smoke = ROOT / "scenarios" / "smoke.toml"
    folders = {p.name for p in (FIXTURES / "store").iterdir()}
    assert f"smoke-{scenario.load(smoke).digest()}" in folders
    probe = ["sessions.probe=equivalence", "design.warmup_requests=1"]
    assert f"smoke-{scenario.load(smoke, probe).digest()}" in folders
    # A newer field set away from its default is part of what is measured.
    assert scenario.load(smoke, ["sessions.think=exponential"]).digest() not in {
        f.split("-", 1)[1] for f in folders
    }
