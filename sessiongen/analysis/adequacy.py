"""Is a run large enough for its statistics? Warnings and notes for the console and report.

- **Interval coverage.** The intervals resample sessions. With few sessions the
  bootstrap cannot see how much sessions differ: bench/interval_coverage.py measured how
  often a nominal 95% (expanded, paired) speedup interval held the true speedup, over
  four models of per-session variation, a hit/miss mixture (half the sessions 4x, the
  others 1x) included (:data:`MEASURED_COVERAGE`). Below
  :data:`~sessiongen.analysis.stats.MIN_SESSIONS` (5) sessions per arm a run gets a
  warning that says so (:func:`session_warning`). At 6 to 8 sessions every model
  covered 96% or more, and :func:`coverage_note` says the intervals are conservative;
  from 16 on the mixture covers near 95% (94-96%) while sessions alike still over-cover
  (97-99.5%), so there is nothing to say that holds for every run.
- **p90 intervals** (per arm and turn) cover far less than 95% at every measured session
  count (:data:`MEASURED_P90_COVERAGE`, :func:`p90_coverage_note`): the p90 of a few
  sessions lies near their largest value, and a bootstrap cannot reach beyond it.
- **Block drift** that could not be checked (:mod:`sessiongen.analysis.drift`).
"""

from __future__ import annotations

import polars as pl

from sessiongen.analysis.drift import drift_units, drift_verdict
from sessiongen.analysis.stats import MIN_SESSIONS
from sessiongen.records.run import Run

#: Sessions -> (lowest, highest) coverage of a nominal 95% speedup interval (expanded,
#: paired, of the median) over the four models of tests/support/coverage.py, 2,000
#: simulated cells each (+-1 point near 95%): ``python bench/interval_coverage.py``.
#: The lowest is the hit/miss mixture's from 5 sessions on, where it was measured.
MEASURED_COVERAGE: dict[int, tuple[float, float]] = {
    2: (0.479, 0.531),
    3: (0.753, 0.823),
    4: (0.867, 0.930),
    5: (0.939, 0.960),
    6: (0.962, 0.985),
    8: (0.964, 0.991),
    16: (0.943, 0.995),
    32: (0.958, 0.994),
}
#: Sessions -> (lowest, highest) coverage of a nominal 95% interval of an arm's p90 TTFT
#: (expanded, sessions as units, as :func:`~sessiongen.analysis.latency.arm_turn_table`
#: computes it), over the same four models and both arms, in the same bench run.
MEASURED_P90_COVERAGE: dict[int, tuple[float, float]] = {
    2: (0.189, 0.289),
    3: (0.316, 0.435),
    4: (0.404, 0.534),
    5: (0.482, 0.617),
    6: (0.544, 0.692),
    8: (0.613, 0.779),
    16: (0.825, 0.896),
    32: (0.905, 0.934),
}
#: A 95% interval is called conservative when every model covered at least this: more
#: than two Monte Carlo standard errors (0.5 point each at 2,000 cells) above 95%.
CONSERVATIVE_FROM = 0.96
#: ... and too narrow when no model covered more than this (two standard errors below).
TOO_NARROW_BELOW = 0.94
#: Fewest independent sessions for which a distribution-free 95% interval of a p90 has a
#: finite upper end: all ``n`` fall below the p90 with probability ``0.9 ** n``, which
#: must be at most 2.5% (0.9 ** 35 = 0.025).
P90_SESSIONS = 35


def _measured(table: dict[int, tuple[float, float]], n: int) -> tuple[str, float, float] | None:
    """Where and what was measured for ``n`` sessions: the count itself, or the span of
    the two measured counts around it (None outside the table)."""
    if n in table:
        low, high = table[n]
        return f"at {n} sessions", low, high
    below = [k for k in table if k < n]
    above = [k for k in table if k > n]
    if not below or not above:
        return None
    a, b = max(below), min(above)
    return (
        f"between {a} and {b} sessions",
        min(table[a][0], table[b][0]),
        max(table[a][1], table[b][1]),
    )


def _sessions(n: int) -> str:
    return f"{n} session{'' if n == 1 else 's'}"


def _pct(low: float, high: float) -> str:
    return f"{low:.0%} to {high:.0%}" if f"{low:.0%}" != f"{high:.0%}" else f"{low:.0%}"


def fewest_sessions(run: Run) -> int | None:
    """The fewest sessions behind any (placement, cache, context, turn) cell with rows.

    In a trace or dataset whose sessions differ in length, the last turns' cells rest on
    the few long sessions: this is the count behind a per-turn interval, never the run's
    session count (that is :func:`arm_sessions`)."""
    cells = (
        run.ok.filter(pl.col("session_index").is_not_null())
        .group_by("placement", "cache", "context_tokens", "turn")
        .agg(n=pl.col("session_index").n_unique())
    )
    return None if cells.is_empty() else int(cells["n"].to_numpy().min())


def arm_sessions(run: Run) -> int | None:
    """The fewest sessions any arm replayed: distinct sessions per (placement, cache,
    context), whatever their lengths. The sessions are the bootstrap's units, so this is
    the count the run's intervals rest on; a session of one turn counts as one."""
    arms = (
        run.ok.filter(pl.col("session_index").is_not_null())
        .group_by("placement", "cache", "context_tokens")
        .agg(n=pl.col("session_index").n_unique())
    )
    return None if arms.is_empty() else int(arms["n"].to_numpy().min())


def _coverage_text(n: int) -> str:
    found = _measured(MEASURED_COVERAGE, n)
    if found is None:
        return ""
    where, low, high = found
    return (
        f"; {where} a nominal 95% interval held the true speedup only "
        f"{_pct(low, high)} of the time (bench/interval_coverage.py)"
    )


def session_warning(n: int | None, *, source: str = "synthetic") -> str | None:
    """The warning for a run whose arms replayed ``n`` sessions (:func:`arm_sessions`),
    or None. The remedy is one the ``source`` of sessions accepts: ``sessions.count`` sets
    only synthetic sessions; a trace or a dataset sets its own."""
    if n is None or n >= MIN_SESSIONS:
        return None
    remedy = {
        "trace": f"Replay a trace with at least {MIN_SESSIONS} sessions",
        "sharegpt": f"Use a dataset selection with at least {MIN_SESSIONS} conversations",
    }.get(source, f"Use sessions.count >= {MIN_SESSIONS}")
    return (
        f"Only {_sessions(n)} per arm: the intervals need at least {MIN_SESSIONS} to cover "
        f"as stated{_coverage_text(n)}. {remedy} for numbers to act on."
    )


def coverage_note(sessions: int) -> str | None:
    """What the report can say of its 95% speedup intervals at ``sessions`` per arm.

    Below :data:`MIN_SESSIONS`: how much less than 95% they covered (the text of
    :func:`session_warning`). Where every model covered at least
    :data:`CONSERVATIVE_FROM`: that they are conservative. Otherwise (near 95%, a range
    that straddles it, or a count outside :data:`MEASURED_COVERAGE`): None.
    """
    found = _measured(MEASURED_COVERAGE, sessions)
    if sessions < MIN_SESSIONS:
        if found is None:
            return (
                f"At {_sessions(sessions)} there is too little to resample: the 95% "
                f"intervals need at least {MIN_SESSIONS} sessions to cover as stated."
            )
        where, low, high = found
        return (
            f"{where[0].upper()}{where[1:]} these 95% intervals held the true speedup only "
            f"{_pct(low, high)} of the time in bench/interval_coverage.py: they are too "
            f"narrow (at least {MIN_SESSIONS} sessions are needed to cover as stated)."
        )
    if found is None or found[1] < CONSERVATIVE_FROM:
        return None
    where, low, high = found
    return (
        f"{where[0].upper()}{where[1:]} these 95% intervals covered {_pct(low, high)} in "
        "bench/interval_coverage.py (four models of how sessions differ): they are "
        "conservative (wider than a 95% interval needs)."
    )


def p90_coverage_note(sessions: int) -> str | None:
    """What the report can say of its 95% p90 TTFT intervals at ``sessions`` per arm.

    Where no model covered more than :data:`TOO_NARROW_BELOW` (every measured count up
    to 32), or beyond the table but below :data:`P90_SESSIONS`: that they are too narrow,
    and why. None where coverage was near 95%, and from :data:`P90_SESSIONS` sessions on
    (not measured there; the bound above no longer forbids a 95% interval).
    """
    if sessions >= P90_SESSIONS:
        return None
    why = (
        f"below {P90_SESSIONS} sessions no distribution-free interval can bound a p90 from "
        "above (all n sessions fall below it with probability 0.9^n > 2.5%), and the "
        "bootstrap never reaches beyond the largest value: the p90 is less certain than "
        "its interval shows."
    )
    found = _measured(MEASURED_P90_COVERAGE, sessions)
    if found is None:
        return f"The 95% p90 TTFT intervals are too narrow at {_sessions(sessions)}: {why}"
    where, low, high = found
    if high >= TOO_NARROW_BELOW:
        return None
    return (
        f"{where[0].upper()}{where[1:]} the 95% p90 TTFT intervals held the true p90 only "
        f"{_pct(low, high)} of the time in bench/interval_coverage.py: {why}"
    )


def interval_warnings(run: Run) -> list[str]:
    """What the console and the report must say before any interval of this run."""
    source = str(run.meta.sessions.get("source", "synthetic"))
    found = [
        session_warning(arm_sessions(run), source=source),
        drift_verdict(drift_units(run)),
    ]
    return [w for w in found if w is not None]
