"""What a finished replay comes to: its summary, its verdicts and its exit status.

One policy for every caller (the CLI's ``replay``, the nightly job, the notebook):

- the **summary**: the decision as ``sessiongen plan`` gives it (at ``pays_at``), the
  trust warnings, the per-turn table, the routers' table, the interval warnings, and the
  report written with that same decision;
- **correctness**: the fault line, the verdict line, and the cache failures (an ON answer
  wrong where the OFF arm answered the same prompt right) as one line;
- the **arm check**: a warning per block whose counters contradict its cache arm;
- the **exit status**: failed requests are a :class:`~sessiongen.errors.RunFailedError`
  (1), cache failures alone a :class:`~sessiongen.errors.CacheFailureError` (1), a
  mislabeled arm fails the run only with ``target.strict_arms``; an interrupted replay
  is judged on nothing and exits 128 plus the signal's number.

Lines go to ``say(text, err=...)`` as they are known, in the order the console prints
them (``err``: standard error); a caller that prints nothing passes :func:`quiet`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sessiongen import analysis
from sessiongen import report as report_mod
from sessiongen.analysis.payoff import DEFAULT_PAYS_AT
from sessiongen.errors import CacheFailureError, RunFailedError
from sessiongen.infra import signals
from sessiongen.replay.orchestrator import ReplayResult
from sessiongen.report.decision import console_text, decide


class Say(Protocol):
    """Where a line goes: standard output, or standard error with ``err=True``."""

    def __call__(self, text: str, /, *, err: bool = False) -> None: ...


def quiet(text: str, /, *, err: bool = False) -> None:
    """A :class:`Say` that keeps everything to itself."""


@dataclass(frozen=True)
class Verdict:
    """A replay judged: what failed it (if anything) and the status to exit with."""

    run_dir: Path
    interrupted: bool = False
    error: RunFailedError | None = None  # why the run failed, one line
    report: Path | None = None  # the report written, if any

    @property
    def exit_status(self) -> int:
        """0 passed; 1 failed requests, cache failures or (strict) a mislabeled arm;
        128 plus the signal's number when interrupted."""
        if self.interrupted:
            return signals.exit_status()
        return self.error.exit_code if self.error is not None else 0


def summarize(
    run_dir: Path, *, write: bool, say: Say, pays_at: float = DEFAULT_PAYS_AT
) -> Path | None:
    """Say the decision (as plan gives it, at ``pays_at``), then the per-turn table and
    what limits it (too few sessions, drift unchecked); write the report when ``write``."""
    whole = analysis.load_run(run_dir)
    run = whole.levels_apart()
    decision = decide(whole, pays_at)
    say(console_text(decision, run.target_label))
    for line in analysis.trust_warnings(run):
        say(line, err=True)
    say(analysis.console_table(run))
    routers = analysis.console_routing(run)
    if routers is not None:
        say(routers)
    for warning in analysis.interval_warnings(run):
        say(f"warning: {warning}")
    if not write:
        return None
    path = report_mod.write_report(run_dir, pays_at=pays_at, decision=decision)
    say(f"report: {path}")
    return path


def correctness(run_dir: Path, *, say: Say) -> str | None:
    """Say the run's correctness verdicts; return its cache failures as one line, if any."""
    run = analysis.load_run(run_dir)
    fault = run.meta.fault_line()
    if fault:
        say(fault)
    verdicts = analysis.correctness(run)
    line = verdicts.verdict_line()
    if line:
        say(line)
    failure = verdicts.failure_line()
    return f"{failure}; see {run_dir}" if failure else None


def arm_check(run_dir: Path, *, say: Say) -> str | None:
    """Warn of each block whose counters contradict its arm; return one line for them."""
    lines = analysis.mislabeled_arms(analysis.load_run(run_dir))
    for line in lines:
        say(f"warning: mislabeled arm: {line}", err=True)
    if not lines:
        return None
    return f"mislabeled arms: {len(lines)} blocks contradict their cache arm; see {run_dir}"


def judge(
    result: ReplayResult,
    *,
    strict_arms: bool,
    write_report: bool,
    say: Say,
    pays_at: float = DEFAULT_PAYS_AT,
) -> Verdict:
    """Summarize a finished replay, check it, and say what it comes to (module docstring).

    A replay that measured nothing, or was interrupted, is neither summarized nor
    checked; its failed requests still fail it.
    """
    wrong = mislabeled = report = None
    if result.requests and not result.interrupted:
        report = summarize(result.run_dir, write=write_report, pays_at=pays_at, say=say)
        wrong = correctness(result.run_dir, say=say)
        mislabeled = arm_check(result.run_dir, say=say)
    if result.interrupted:
        say(f"interrupted: kept {result.requests} measured requests", err=True)
        return Verdict(result.run_dir, interrupted=True)
    strict = mislabeled if strict_arms else None
    error: RunFailedError | None = None
    if result.failed:
        error = RunFailedError("; ".join(filter(None, [result.failure_summary(), wrong, strict])))
    elif wrong:
        error = CacheFailureError("; ".join(filter(None, [wrong, strict])))
    elif strict:
        error = RunFailedError(strict)
    return Verdict(result.run_dir, error=error, report=report)
