"""Session adequacy counts sessions, whatever their lengths.

A trace or a dataset has sessions of their own lengths: its last turns rest on the few
long sessions, but the run's intervals resample all of its sessions. The warning "Only N
sessions per arm" must count those, and give a remedy the run's source accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.adequacy import arm_sessions, fewest_sessions, session_warning
from tests.support.synthetic import SyntheticSpec, write_run


def _uneven(run_dir: Path) -> Path:
    """Keep only turn 1 of every session but the first: sessions of 6 turns and of 1."""
    path = run_dir / "requests.parquet"
    rows = pl.read_parquet(path)
    keep = (pl.col("session_index") == pl.col("session_index").min()) | (pl.col("turn") == 1)
    rows.filter(keep | pl.col("session_index").is_null()).write_parquet(path)
    return run_dir


def test_sessions_of_different_lengths_are_counted_as_sessions(tmp_path: Path) -> None:
    spec = SyntheticSpec(sessions=8, turns=6, placements=("fixed",))
    run = analysis.load_run(_uneven(write_run(tmp_path / "uneven", spec)))
    assert fewest_sessions(run) == 1  # the 6th turn's cell: one long session
    assert arm_sessions(run) == 8  # the run replayed 8 sessions per arm
    assert not any("sessions per arm" in w for w in analysis.interval_warnings(run))


def test_few_sessions_get_a_remedy_their_source_accepts(tmp_path: Path) -> None:
    assert "sessions.count >= 5" in (session_warning(2) or "")
    trace = session_warning(2, source="trace") or ""
    assert "Only 2 sessions per arm" in trace and "sessions.count" not in trace
    assert "trace with at least 5 sessions" in trace
    assert "sessions.count" not in (session_warning(1, source="sharegpt") or "")
    assert "Only 1 session per arm" in (session_warning(1) or "")
    few = write_run(tmp_path / "few", SyntheticSpec(sessions=3, turns=2, placements=("fixed",)))
    manifest = json.loads((few / "manifest.json").read_text())
    manifest["scenario"]["sessions"]["source"] = "sharegpt"
    (few / "manifest.json").write_text(json.dumps(manifest))
    [warning] = analysis.interval_warnings(analysis.load_run(few))
    assert "Only 3 sessions per arm" in warning and "dataset selection" in warning
