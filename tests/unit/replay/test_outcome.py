"""What a finished replay comes to (sessiongen.outcome): one policy for the CLI,
the nightly job and the notebook, judged here on synthetic runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sessiongen import outcome
from sessiongen.errors import CacheFailureError, RunFailedError
from sessiongen.replay import ReplayResult
from tests.support.synthetic import SyntheticSpec, write_run

CLEAN = SyntheticSpec(sessions=6, turns=2, placements=("alternate",))
#: Every session misses its turn-6 needle in the first ON block, served by the pool.
WRONG = SyntheticSpec(
    sessions=4, turns=6, placements=("alternate",), probe="needle", needle_wrong=4
)


class Heard:
    """A :class:`outcome.Say` that keeps what it was told, and where."""

    def __init__(self) -> None:
        self.lines: list[tuple[bool, str]] = []

    def __call__(self, text: str, /, *, err: bool = False) -> None:
        self.lines.append((err, text))

    def said(self, start: str, *, err: bool = False) -> bool:
        return any(e == err and t.startswith(start) for e, t in self.lines)


def test_a_clean_run_passes_after_its_summary_and_report(tmp_path: Path) -> None:
    run = write_run(tmp_path, CLEAN)
    heard = Heard()
    verdict = outcome.judge(
        ReplayResult(run, requests=24), strict_arms=True, write_report=True, pays_at=1.1, say=heard
    )
    assert verdict.error is None and verdict.exit_status == 0 and not verdict.interrupted
    assert verdict.report == run / "report" / "report.md" and verdict.report.is_file()
    assert heard.lines[0][1].startswith("Decision: does the pool pay (session gain >= 1.1)?")
    assert heard.said(f"report: {verdict.report}")


def test_failed_requests_fail_the_run_with_their_count(tmp_path: Path) -> None:
    run = write_run(tmp_path, CLEAN)
    result = ReplayResult(run, requests=24, failures=Counter({"timeout": 2}))
    verdict = outcome.judge(
        result, strict_arms=False, write_report=False, pays_at=1.1, say=outcome.quiet
    )
    assert isinstance(verdict.error, RunFailedError) and verdict.exit_status == 1
    assert not isinstance(verdict.error, CacheFailureError)
    assert str(verdict.error) == f"2 of 24 requests failed (2 timeout); see {run}"


def test_cache_failures_alone_are_their_own_error(tmp_path: Path) -> None:
    run = write_run(tmp_path, WRONG)
    heard = Heard()
    verdict = outcome.judge(
        ReplayResult(run, requests=10),
        strict_arms=False,
        write_report=False,
        pays_at=1.1,
        say=heard,
    )
    assert isinstance(verdict.error, CacheFailureError) and verdict.exit_status == 1
    assert str(verdict.error).startswith("cache failures: 4 pool-served needle answers wrong")
    assert str(verdict.error).endswith(f"; see {run}")
    assert verdict.report is None  # not asked for


def test_an_interrupted_run_is_judged_on_nothing(tmp_path: Path) -> None:
    run = write_run(tmp_path, WRONG)
    heard = Heard()
    result = ReplayResult(run, requests=7, failures=Counter({"x": 1}), interrupted=True)
    verdict = outcome.judge(result, strict_arms=True, write_report=True, pays_at=1.1, say=heard)
    assert verdict.interrupted and verdict.error is None and verdict.report is None
    assert heard.lines == [(True, "interrupted: kept 7 measured requests")]
    assert verdict.exit_status == 130  # no signal came: Ctrl-C's status


@pytest.mark.parametrize("strict", [False, True])
def test_a_mislabeled_arm_fails_the_run_only_when_strict(tmp_path: Path, strict: bool) -> None:
    run = write_run(tmp_path, SyntheticSpec(sessions=6, turns=2, contaminate=True))
    heard = Heard()
    verdict = outcome.judge(
        ReplayResult(run, requests=24),
        strict_arms=strict,
        write_report=False,
        pays_at=1.1,
        say=heard,
    )
    assert heard.said("warning: mislabeled arm: ", err=True)
    if strict:
        assert isinstance(verdict.error, RunFailedError)
        assert str(verdict.error).startswith("mislabeled arms: ")
    else:
        assert verdict.error is None
