"""The answer first: a replay's console and report open with plan's decision.

A demo-like replay on the embedded simulated pair (smoke, five sessions so that a
verdict is possible, both placements), through the command line as a user runs it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from sessiongen.analysis.stats import MIN_SESSIONS
from sessiongen.cli import cli
from sessiongen.report import write_report
from tests.support.paths import ROOT

GAIN = re.compile(r"^(?P<gain>[\d.]+) \[(?P<low>[\d.]+), (?P<high>[\d.]+)\]")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    runs = tmp_path_factory.mktemp("runs")
    args = [
        "replay",
        str(ROOT / "scenarios/smoke.toml"),
        "--runs-dir",
        str(runs),
        "--no-progress",
        "--set",
        "sessions.count=5",
        "--set",
        'placement.policies=["alternate","fixed"]',
        "--set",
        "target.sim.time_scale=0.1",  # as the replay fixtures: what is checked is counted
        "--set",
        "driver.concurrency=1",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (run_dir,) = runs.iterdir()
    return result, run_dir


def opening_table(markdown: str) -> tuple[str, list[dict[str, str]]]:
    """The first table after the report's first heading, and the heading above it."""
    lines = markdown.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("# "))
    start = next(i for i in range(first + 1, len(lines)) if lines[i].startswith("|"))
    headings = [line for line in lines[first + 1 : start] if line.startswith("#")]
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    header, _rule, *body = rows
    return headings[-1] if headings else "", [dict(zip(header, r, strict=True)) for r in body]


def expected(low: float, high: float, pays_at: float) -> str:
    return "pays" if low >= pays_at else "does not pay" if high < pays_at else "undecided"


def check_verdicts(rows: list[dict[str, str]], pays_at: float) -> None:
    """Each row's verdict is what its interval (as shown, 2 decimals) says at pays_at."""
    for row in rows:
        match = GAIN.match(row["session gain [95% CI]"])
        assert match, row
        low, high = float(match["low"]), float(match["high"])
        assert low <= float(match["gain"]) <= high
        assert int(row["sessions"]) >= MIN_SESSIONS
        if row["verdict"].startswith("unstable"):  # a queue grew: no interval decides
            assert row["session gain [95% CI]"].endswith("(unstable)")
            continue
        if min(abs(low - pays_at), abs(high - pays_at)) < 0.005:
            continue  # the rounding shown cannot tell which side of the threshold it is
        assert row["verdict"] == expected(low, high, pays_at), row


def test_the_report_opens_with_the_decision_for_each_placement(
    replayed: tuple[Result, Path],
) -> None:
    _result, run_dir = replayed
    heading, rows = opening_table((run_dir / "report" / "report.md").read_text())
    assert heading == "## Decision: does the pool pay (session gain >= 1.1)?"
    assert [r["placement"] for r in rows] == ["alternate", "fixed"]
    assert {
        "later-turn gain [95% CI]",
        "median per-turn gain (turns 2..)",
        "turns apart from that median",
    } <= set(rows[0])
    check_verdicts(rows, 1.1)
    # decision.csv: the same rows under the plan's column names
    table = pl.read_csv(run_dir / "report" / "decision.csv")
    assert table["verdict"].to_list() == [r["verdict"] for r in rows]
    assert {"session_gain", "later_gain", "later_turn_gain", "pays_at"} <= set(table.columns)


@pytest.mark.parametrize("where", ["below", "inside", "above"])
def test_the_verdict_reads_the_interval_at_pays_at(
    replayed: tuple[Result, Path], where: str, tmp_path: Path
) -> None:
    """A threshold below every interval, inside the first placement's, above every one
    (from the replay's own intervals: a busy machine widens them)."""
    measured = pl.read_csv(replayed[1] / "report" / "decision.csv")
    low = measured["session_gain_low"].to_list()
    high = measured["session_gain_high"].to_list()
    pays_at = {
        "below": round(min(low) * 0.9, 3),
        "inside": round((low[0] + high[0]) / 2, 3),
        "above": round(max(high) * 1.1, 3),
    }[where]
    copy = shutil.copytree(replayed[1], tmp_path / "run", ignore=shutil.ignore_patterns("report"))
    heading, rows = opening_table(write_report(copy, pays_at=pays_at).read_text())
    assert heading.endswith(f"(session gain >= {pays_at:g})?")
    check_verdicts(rows, pays_at)
    stable = [r["verdict"] for r in rows if not r["verdict"].startswith("unstable")]
    if where == "below":
        assert set(stable) <= {"pays"}
    if where == "above":
        assert set(stable) <= {"does not pay"}


def test_the_console_opens_with_the_decision(replayed: tuple[Result, Path]) -> None:
    result, run_dir = replayed
    lines = result.stdout.splitlines()
    assert lines[0] == f"run: {run_dir}"
    assert lines[1].startswith("Decision: does the pool pay (session gain >= 1.1)? MEASURED")
    assert lines[2].split()[:4] == ["placement", "session", "gain", "[95%"]
    _heading, rows = opening_table((run_dir / "report" / "report.md").read_text())
    for line, row in zip(lines[3:5], rows, strict=True):
        assert line.startswith(row["placement"])
        assert row["session gain [95% CI]"] in line and line.endswith(row["verdict"])
    # then the per-turn curve
    assert lines[5].startswith("Median TTFT per turn")
