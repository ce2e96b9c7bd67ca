"""The console table of a one-arm run has no speedup column, and a missing ratio reads
"-" ("-x" in single-arm speedup columns)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl

from sessiongen import analysis
from tests.support.synthetic import SyntheticSpec, write_run


def test_a_one_arm_run_has_its_arm_and_no_speedup(tmp_path: Path) -> None:
    spec = SyntheticSpec(sessions=2, turns=2, placements=("fixed",), blocks=("on", "on"))
    text = analysis.console_table(analysis.load_run(write_run(tmp_path, spec)))
    lines = text.splitlines()
    assert lines[1].startswith("cache on only: no speedup until the other arm's run")
    assert lines[2].split() == ["turn", "fixed", "on"]
    assert "x" not in "".join(lines[3:]) and "speedup" not in lines[2]


def test_a_missing_ratio_reads_a_dash(tmp_path: Path) -> None:
    spec = SyntheticSpec(sessions=2, turns=2, placements=("fixed",))
    run = analysis.load_run(write_run(tmp_path, spec))
    gone = (pl.col("cache") == "on") & (pl.col("turn") == 2)
    run = dataclasses.replace(run, requests=run.requests.filter(~gone))
    last = analysis.console_table(run).splitlines()[-1].split()
    assert last[0] == "2" and last[-1] == "-" and last[-2] == "-"


def test_a_ratio_with_one_arm_empty_is_what_the_bootstrap_says_without_resampling(
    tmp_path: Path,
) -> None:
    from sessiongen.analysis import stats
    from sessiongen.analysis.frames import clusters
    from sessiongen.analysis.latency import DEFAULT_BOOTSTRAP, _ratio

    spec = SyntheticSpec(sessions=6, turns=2, placements=("fixed",), blocks=("on", "on"))
    run = analysis.load_run(write_run(tmp_path, spec))
    on = run.ok.filter(pl.col("cache") == "on")
    off = on.clear()
    assert on.height > 0
    for a, b in ((off, on), (on, off)):
        ci, n = _ratio(a, b, False, DEFAULT_BOOTSTRAP, [1, 2])
        full = stats.bootstrap_ratio(clusters(a), clusters(b), **DEFAULT_BOOTSTRAP.options([1, 2]))
        assert repr((ci, n)) == repr((full, full.n))  # NaNs compared by their text
