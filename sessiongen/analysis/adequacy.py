"""Is a run large enough for its statistics? Warnings for the console and the report.

- **Interval coverage.** Speedup intervals resample sessions. With few sessions the
  bootstrap cannot see how much sessions differ: bench/interval_coverage.py measured how
  often a nominal 95% (expanded, paired) interval held the true speedup, over three
  models of per-session variation (:data:`MEASURED_COVERAGE`). Below
  :data:`~sessiongen.analysis.stats.MIN_SESSIONS` (5) sessions per arm a run gets a
  warning that says so.
- **Block drift** that could not be checked (:mod:`sessiongen.analysis.drift`).
"""

from __future__ import annotations

import polars as pl

from sessiongen.analysis.drift import drift_units, drift_verdict
from sessiongen.analysis.stats import MIN_SESSIONS
from sessiongen.records.run import Run

#: Sessions -> (lowest, highest) coverage of a nominal 95% speedup interval over the
#: models of tests/support/coverage.py, 2,000 simulated cells each (+-1 point):
#: ``python bench/interval_coverage.py``.
MEASURED_COVERAGE: dict[int, tuple[float, float]] = {
    2: (0.496, 0.531),
    4: (0.891, 0.930),
    5: (0.940, 0.960),
    8: (0.979, 0.991),
    16: (0.972, 0.995),
}


def fewest_sessions(run: Run) -> int | None:
    """The fewest sessions behind any (placement, cache, context, turn) cell with rows."""
    cells = (
        run.ok.filter(pl.col("session_index").is_not_null())
        .group_by("placement", "cache", "context_tokens", "turn")
        .agg(n=pl.col("session_index").n_unique())
    )
    return None if cells.is_empty() else int(cells["n"].to_numpy().min())


def _coverage_text(n: int) -> str:
    known = [k for k in MEASURED_COVERAGE if k <= n]
    if not known:
        return ""
    at = max(known)
    low, high = MEASURED_COVERAGE[at]
    return (
        f"; at {at} sessions a nominal 95% interval held the true speedup only "
        f"{low:.0%} to {high:.0%} of the time (bench/interval_coverage.py)"
    )


def session_warning(n: int | None) -> str | None:
    """The warning for a run whose cells rest on ``n`` sessions, or None."""
    if n is None or n >= MIN_SESSIONS:
        return None
    return (
        f"Only {n} sessions per arm: the intervals need at least {MIN_SESSIONS} to cover as "
        f"stated{_coverage_text(n)}. Use sessions.count >= {MIN_SESSIONS} for numbers "
        "to act on."
    )


def interval_warnings(run: Run) -> list[str]:
    """What the console and the report must say before any interval of this run."""
    found = [session_warning(fewest_sessions(run)), drift_verdict(drift_units(run))]
    return [w for w in found if w is not None]
