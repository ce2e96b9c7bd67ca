"""Coverage of the intervals at the shipped session counts, and the warnings and notes.

Fixed seeds (tests/support/coverage.py): the figures are the same on every machine, and
the bounds leave room for the 300-cell Monte Carlo error (one standard error is about
1.3 points near 95%). bench/interval_coverage.py prints the figures with 2,000 cells.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongen import analysis, outcome
from sessiongen.analysis import stats
from sessiongen.analysis.adequacy import (
    MEASURED_COVERAGE,
    coverage_note,
    interval_warnings,
    p90_coverage_note,
)
from tests.support.coverage import MODELS, coverage
from tests.support.synthetic import SyntheticSpec, write_run

UNEVEN = MODELS[2]  # the hardest of the unimodal models
MIXTURE = MODELS[3]  # half the sessions 4x, the others 1x


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
    assert "87% to 93%" in warning
    outcome.summarize(few, write=True, pays_at=1.1, say=lambda text, err=False: print(text))
    printed = capsys.readouterr().out
    assert "warning: Only 4 sessions per arm" in printed
    assert "Only 4 sessions per arm" in (few / "report" / "report.md").read_text()
    enough = write_run(tmp_path / "ok", SyntheticSpec(sessions=8, turns=2, placements=("fixed",)))
    assert interval_warnings(analysis.load_run(enough)) == []


def test_a_hit_miss_mixture_at_8_sessions() -> None:
    """The hard case: covered near 95% (96.4% over 2,000 cells), not 99% as sessions
    alike are, and only thanks to the expansion (plain: 89.4%); its p90 intervals fall
    far short (69.5-71.4%). 300 cells: one standard error is 1.1 points near 96%."""
    expanded = coverage(MIXTURE, 8, reps=300)
    plain = coverage(MIXTURE, 8, reps=300, expand=False)
    p90_on = coverage(MIXTURE, 8, reps=300, q=0.9, of="on")
    assert 0.93 <= expanded <= 0.99, expanded
    assert plain < expanded and plain <= 0.94, (plain, expanded)
    assert p90_on <= 0.85, p90_on


def test_the_report_says_when_95_percent_over_covers() -> None:
    low8, high8 = MEASURED_COVERAGE[8]
    note = coverage_note(8)
    assert note is not None and "conservative" in note
    assert f"At 8 sessions these 95% intervals covered {low8:.0%} to {high8:.0%}" in note
    assert "conservative" in (coverage_note(6) or "")
    assert "Between 6 and 8 sessions" in (coverage_note(7) or "")
    # near 95% somewhere (5: 94-96%; 16: the mixture 94.3%): nothing to add
    for near in (5, 12, 16, 32, 64):
        assert coverage_note(near) is None, near
    # below the minimum: the under-coverage text
    assert "only 87% to 93%" in (coverage_note(4) or "") and "too narrow" in (
        coverage_note(4) or ""
    )
    assert "at least 5 sessions" in (coverage_note(1) or "")


def test_the_p90_intervals_are_said_to_be_too_narrow() -> None:
    assert "61% to 78%" in (p90_coverage_note(8) or "")
    assert "below 35 sessions" in (p90_coverage_note(32) or "")
    assert p90_coverage_note(35) is None
