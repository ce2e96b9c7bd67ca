"""A compared cell's tests and decision: the ratio B/A (sampling plus run-to-run noise),
"B fails more" (sessions as units, per cell and over the run), Holm over the cells.

The method is :mod:`.compare`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from sessiongen.analysis import hypotheses, stats
from sessiongen.analysis.comparecells import CellData, cell_sizes, fails_more
from sessiongen.analysis.runnoise import RunNoise
from sessiongen.analysis.stats import MIN_SESSIONS


def _latency_test(cell: CellData, noise: RunNoise) -> hypotheses.LogTest:
    point_a, point_b = cell.split(cell.point)
    draws_a, draws_b = cell.split(cell.draws)
    estimate = float(np.mean(point_b) - np.mean(point_a))
    diff = np.nanmean(draws_b, axis=1) - np.nanmean(draws_a, axis=1)
    n = cell.n_units
    sampling = stats.robust_sd(diff) * stats.small_sample_factor(n)
    sd, df = noise.of(tuple(cell.key.values()))
    run_var = sd**2 * (1 / point_a.size + 1 / point_b.size)
    parts = [(sampling**2, float(n - 1)), (run_var, df)]
    se = math.sqrt(sampling**2 + run_var) if math.isfinite(sampling) else math.nan
    return hypotheses.LogTest(estimate, se, hypotheses.welch_df(parts))


def _session_failure_shares(subs: Sequence[pl.DataFrame], units: list[Any]) -> Any:
    """Per session: the share of its requests in the cell that failed, over the runs."""
    frame = pl.concat([s.select("session_index", "_failed") for s in subs])
    shares = frame.group_by("session_index").agg(pl.col("_failed").mean())
    lookup = dict(zip(shares["session_index"].to_list(), shares["_failed"].to_list(), strict=True))
    return np.array([lookup.get(u, np.nan) for u in units], dtype=np.float64)


@dataclass(frozen=True)
class _FailureTest:
    p_worse: float  # B fails more (sessions as units)
    no_worse: bool  # B's failure share surely within the margin of A's


def _failure_test(cell: CellData, margin: float, alpha: float) -> _FailureTest:
    failed_a = sum(float(s["_failed"].sum()) for s in cell.subs_a)
    failed_b = sum(float(s["_failed"].sum()) for s in cell.subs_b)
    if failed_b == 0 and failed_a == 0:
        return _FailureTest(1.0, True)
    if cell.units is not None:
        diff = _session_failure_shares(cell.subs_b, cell.units) - _session_failure_shares(
            cell.subs_a, cell.units
        )
        p = hypotheses.sign_test_greater(diff)
        bound = hypotheses.upper_mean_bound(diff, conf=1 - alpha)
        return _FailureTest(p, bool(np.nanmax(diff) <= 0 or bound <= margin))
    shares_a, shares_b = _own_failure_shares(cell.subs_a), _own_failure_shares(cell.subs_b)
    p = stats.mann_whitney(shares_a, shares_b, alternative="b-greater").p_value
    no_worse = bool(np.mean(shares_b) <= np.mean(shares_a))
    upper = hypotheses.upper_difference_bound(shares_b, shares_a, conf=1 - alpha)
    return _FailureTest(1.0 if math.isnan(p) else p, no_worse or upper <= margin)


def _own_failure_shares(subs: Sequence[pl.DataFrame]) -> Any:
    frame = pl.concat([s.select("session_index", "_failed") for s in subs])
    if frame["session_index"].null_count():
        return frame["_failed"].to_numpy().astype(np.float64)
    return frame.group_by("session_index").agg(pl.col("_failed").mean())["_failed"].to_numpy()


def _decide(
    test: hypotheses.LogTest,
    fails: _FailureTest,
    holm_slower: float,
    holm_faster: float,
    threshold: float,
    alpha: float,
) -> tuple[str, str]:
    """A cell's decision and why (see the module docstring)."""
    if holm_slower < alpha:
        slow_latency = test.p_above(1 + threshold) <= fails.p_worse
        return "slower", "latency" if slow_latency else "fails more"
    if not fails.no_worse:
        return "inconclusive", "more failures in B"
    if holm_faster < alpha:
        return "faster", ""
    equivalent = max(test.p_below(1 + threshold), test.p_above(1 - threshold)) < alpha
    return ("no change", "") if equivalent else ("inconclusive", "")


def run_failure_p(cells: Sequence[CellData]) -> float:
    """One-sided p of "B fails more" over the whole run, sessions as units.

    Per session, the share of its requests that failed in all the cells (B minus A, over
    the sessions both sides hold): a one-sided Student t test on those differences
    (:func:`~.hypotheses.mean_exceeds`). A per-cell sign test cannot fire at the shipped
    session counts once Holm-corrected (its smallest p is 2^-n: 0.004 at 8 sessions,
    against 0.05 / 25), nor could a run-wide one; the t test on a run-wide share can,
    and it is one more member of the family.
    """
    if not cells:
        return 1.0
    sides = [
        pl.concat([s.select("session_index", "_failed") for c in cells for s in c.subs_a]),
        pl.concat([s.select("session_index", "_failed") for c in cells for s in c.subs_b]),
    ]
    if any(side["session_index"].null_count() for side in sides):
        return 1.0
    shares = [side.group_by("session_index").agg(pl.col("_failed").mean()) for side in sides]
    both = shares[0].join(shares[1], on="session_index", suffix="_b")
    return hypotheses.mean_exceeds((both["_failed_b"] - both["_failed"]).to_numpy())


def cell_rows(
    cells: Sequence[CellData], noise: RunNoise, threshold: float, alpha: float, margin: float
) -> list[dict[str, object]]:
    """One decided row per cell held by both sides; Holm over the cells that can decide,
    with the run-wide failure test as one more member of the "slower" family."""
    tests = [_latency_test(c, noise) for c in cells]
    fails = [_failure_test(c, margin, alpha) for c in cells]
    able = np.array([c.n_units >= MIN_SESSIONS for c in cells])
    slower = np.array(
        [[t.p_above(1 + threshold), f.p_worse] for t, f in zip(tests, fails, strict=True)]
    ).reshape(-1, 2)
    faster = np.array([t.p_below(1 - threshold) for t in tests])
    family = np.append(np.where(able[:, None], slower, np.nan).ravel(), run_failure_p(cells))
    adjusted = stats.holm(family)
    slower_adj, run_fails = adjusted[:-1].reshape(-1, 2), bool(adjusted[-1] < alpha)
    faster_adj = stats.holm(np.where(able, faster, np.nan))
    conf = 1 - 2 * alpha
    rows = []
    for i, (cell, test, fail) in enumerate(zip(cells, tests, fails, strict=True)):
        p_slow = float(np.nanmin(slower_adj[i])) if able[i] else math.nan
        if able[i]:
            decision, why = _decide(test, fail, p_slow, float(faster_adj[i]), threshold, alpha)
            if run_fails and decision != "slower" and fails_more(cell):
                decision, why = "slower", "fails more (over the whole run)"
        else:
            decision, why = "inconclusive", f"fewer than {MIN_SESSIONS} sessions"
        low, high = test.interval(conf)
        rows.append(
            {
                **cell_sizes(cell),
                "sessions": cell.n_units,
                "paired": cell.units is not None,
                "ratio": math.exp(test.estimate) if math.isfinite(test.estimate) else None,
                "ratio_ci_low": low if math.isfinite(low) else None,
                "ratio_ci_high": high if math.isfinite(high) else None,
                "p_slower": p_slow if math.isfinite(p_slow) else None,
                "decision": decision,
                "why": why,
            }
        )
    return rows
