"""The trend's counted metrics: cache failures and contamination at any size on the newest
night, and failed requests above the earlier nights' rate (not fitted: :mod:`.check`).
"""

from __future__ import annotations

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis import hypotheses
from sessiongen.records.format import CELL_KEYS as CELL
from sessiongen.trend.series import Finding, Nights, aligned
from sessiongen.trend.store import changed_versions

#: Count metrics that are regressions at any size on the newest night.
ANY_SIZE = ("cache_failures", "contamination")


def _legacy_cache_failures() -> pl.Expr:
    """Per cell, for stores without ``cache_failures`` (see the module docstring)."""
    wrong = (pl.col("needle_graded") - pl.col("needle_correct")).fill_null(0)
    both_arms = pl.col("cache").n_unique() == 2
    on_wrong = wrong.filter(pl.col("cache") == "on").sum()
    off_wrong = wrong.filter(pl.col("cache") == "off").sum()
    divergences = pl.col("divergences").fill_null(0).max()
    needles = pl.when(both_arms & (off_wrong == 0)).then(on_wrong).otherwise(0)
    return pl.when(both_arms).then(divergences).otherwise(0) + needles


def cell_counts(frame: pl.DataFrame) -> pl.DataFrame:
    """Per run, placement, context and turn: cache failures, contamination and errors.

    ``legacy`` marks cells counted from a store without ``cache_failures``.
    """
    if "cache_failures" not in frame.columns:
        frame = frame.with_columns(cache_failures=pl.lit(None, dtype=pl.UInt32))
    legacy = pl.col("cache_failures").is_null().all()
    return frame.group_by("run_id", "placement", "context_tokens", "turn").agg(
        cache_failures=pl.when(legacy)
        .then(_legacy_cache_failures())
        .otherwise(pl.col("cache_failures").fill_null(0).sum()),
        contamination=pl.col("contamination").fill_null(0).sum(),
        errors=pl.col("errors").fill_null(0).sum(),
        requests=(pl.col("n").fill_null(0) + pl.col("errors").fill_null(0)).sum(),
        legacy=legacy,
    )


def night_counts(frame: pl.DataFrame, nights: Nights) -> dict[str, NDArray[np.float64]]:
    """Per night: cache failures, contamination, failed requests and all requests."""
    names = (*ANY_SIZE, "errors", "requests")
    totals = cell_counts(frame).group_by("run_id").agg(pl.col(*names).sum())
    return {name: aligned(totals, nights, name) for name in names}


#: Level of the test that the newest nights' error rate is above the earlier nights'.
ERROR_ALPHA = 0.01


def errors_above_baseline(
    errors: NDArray[np.float64], requests: NDArray[np.float64], start: int
) -> bool:
    """Whether nights ``start..`` (the newest ``min_nights``) fail requests more often
    than the nights before them.

    Failed requests have a rate of their own on every target (a replica's occasional
    timeout); an alarm on any error at all fired night after night on a store whose rate
    never changed. The newest nights' pooled rate is tested against the earlier nights'
    (one-sided exact test, :func:`~sessiongen.analysis.hypotheses.rate_exceeds`, level
    :data:`ERROR_ALPHA`). With fewer than two earlier nights there is no baseline, and
    errors on each of the newest nights are a finding, as before.
    """
    e = np.nan_to_num(errors)
    r = np.nan_to_num(requests)
    if start < 2 or r[:start].sum() <= 0:
        return True
    p = hypotheses.rate_exceeds(
        int(e[start:].sum()), int(r[start:].sum()), int(e[:start].sum()), int(r[:start].sum())
    )
    return p < ERROR_ALPHA


def _count_detail(frame: pl.DataFrame, run_id: str, name: str) -> str:
    """The cells of one night where a count is nonzero, briefly."""
    night = frame.filter(pl.col("run_id") == run_id)
    if name == "cache_failures":  # ON answers, judged per cell
        rows = cell_counts(night).with_columns(cache=pl.lit("on"), _n=pl.col(name))
    else:
        rows = night.with_columns(_n=pl.col(name).fill_null(0), legacy=pl.lit(False))
    rows = rows.filter(pl.col("_n") > 0).sort(*CELL)
    parts = [
        f"{r['placement']}/{r['cache']} {r['context_tokens']} t{r['turn']}: {r['_n']}"
        for r in rows.iter_rows(named=True)
    ]
    text = ", ".join(parts[:3]) + (f" (+{len(parts) - 3} more)" if len(parts) > 3 else "")
    if rows["legacy"].any():
        text += " (store without cache_failures: counted from divergences and needle grades)"
    return text


def count_findings(frame: pl.DataFrame, nights: Nights, min_nights: int) -> list[Finding]:
    """Correctness and contamination at any size on the newest night; persistent errors."""
    out: list[Finding] = []
    every = night_counts(frame, nights)
    for name in (*ANY_SIZE, "errors"):
        counts = every[name]
        seen = np.nan_to_num(counts) > 0
        trailing = len(seen) - (np.flatnonzero(~seen)[-1] + 1 if (~seen).any() else 0)
        needed = 1 if name in ANY_SIZE else min_nights
        if trailing < needed:
            continue
        start = len(seen) - trailing
        if name == "errors":
            newest = len(seen) - needed
            if not errors_above_baseline(counts, every["requests"], newest):
                continue
            if newest >= 2:  # the rise is dated to the nights tested against the rest
                start = newest
                trailing = needed
        prev = nights.versions[start - 1] if start else nights.versions[start]
        out.append(
            {
                "kind": "regression",
                "metric": name,
                "started": nights.labels[start],
                "started_run": nights.run_ids[start],
                "nights": trailing,
                "before": float(counts[start - 1]) if start else None,
                "after": float(counts[-1]),
                "detail": _count_detail(frame, nights.run_ids[-1], name),
                "versions_changed": changed_versions(prev, nights.versions[start]),
            }
        )
    return out
