"""Coverage of the speedup interval at the shipped session counts, and the warnings.

Fixed seeds (tests/support/coverage.py): the figures are the same on every machine, and
the bounds leave room for the 300-cell Monte Carlo error (one standard error is about
1.3 points near 95%). bench/interval_coverage.py prints the figures with 2,000 cells.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongen import analysis, cli
from sessiongen.analysis import stats
from sessiongen.analysis.adequacy import interval_warnings
from tests.support.coverage import MODELS, coverage
from tests.support.synthetic import SyntheticSpec, write_run

UNEVEN = MODELS[2]  # the hardest of the three models


def test_expanded_conf_follows_hesterberg() -> None:
    assert stats.expanded_conf(0.95, 1) == 0.95
    assert stats.expanded_conf(0.95, 4) == pytest.approx(0.99976, abs=1e-5)
    assert stats.expanded_conf(0.95, 16) == pytest.approx(0.9723, abs=1e-3)
    assert stats.expanded_conf(0.95, 10_000) == pytest.approx(0.95, abs=1e-3)


def test_t_interval_is_students() -> None:
    ci = stats.t_interval([1.0, 2.0, 3.0], conf=0.95)
    assert (ci.estimate, ci.n) == (2.0, 3)
    assert ci.high - ci.estimate == pytest.approx(4.302653 / 3**0.5, rel=1e-6)  # t(0.975, 2)
    assert stats.t_interval([5.0]).n == 1 and stats.t_interval([]).n == 0


def test_coverage_at_the_shipped_counts() -> None:
    at = {n: coverage(UNEVEN, n, reps=300) for n in (2, 4, stats.MIN_SESSIONS, 8)}
    plain4 = coverage(UNEVEN, 4, reps=300, expand=False)
    assert at[2] < 0.65, at  # 3 distinct resamples: no method helps (50% measured)
    assert plain4 < at[4] < 0.93, (plain4, at)  # expansion helps, but not enough at 4
    assert at[stats.MIN_SESSIONS] >= 0.91, at  # near nominal from the minimum on
    assert at[8] >= 0.93, at


def test_few_sessions_are_warned_about_in_console_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    few = write_run(tmp_path / "few", SyntheticSpec(sessions=4, turns=2, placements=("fixed",)))
    [warning] = interval_warnings(analysis.load_run(few))
    assert "Only 4 sessions per arm" in warning and f"at least {stats.MIN_SESSIONS}" in warning
    assert "89% to 93%" in warning
    cli._summarize(few, report=True)
    printed = capsys.readouterr().out
    assert "warning: Only 4 sessions per arm" in printed
    assert "Only 4 sessions per arm" in (few / "report" / "report.md").read_text()
    enough = write_run(tmp_path / "ok", SyntheticSpec(sessions=8, turns=2, placements=("fixed",)))
    assert interval_warnings(analysis.load_run(enough)) == []
