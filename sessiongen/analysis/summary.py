"""One row per cell with the headline metrics: what ``summary.csv`` and the trend store hold.

A cell is a placement, cache arm, context and turn, so the one gain here is the turn's:
``speedup`` = the turn's median TTFT OFF / ON (the report's per-turn curve). The
whole-session ratio is never called a speedup: it is the **session gain**
(:data:`~sessiongen.analysis.latency.SESSION_GAIN`), and with the later-turn gain and the
verdict it is in the report's ``decision.csv``, one row per placement (and context, load
level), under the names a plan's ``whatif.parquet`` uses. The columns keep their names:
the trend store reads them.
"""

from __future__ import annotations

import polars as pl

from sessiongen.analysis.checks import needle_grades
from sessiongen.analysis.correctness import LOGPROB_TOL
from sessiongen.analysis.latency import arm_turn_table, speedup_table
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.analysis.verdicts import CELL_COUNTS, correctness_cells
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

#: The speedup columns, filled on ON rows only.
SPEEDUP_COLUMNS = (
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_log_se",
    "speedup_sessions",
)


def run_summary(
    run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP, logprob_tol: float = LOGPROB_TOL
) -> pl.DataFrame:
    """One row per (placement, cache, context_tokens, turn) with the headline metrics.

    Intervals are 95% expanded bootstrap intervals over sessions; ``sessions`` counts
    the sessions behind each arm's (``speedup_sessions``: the speedup's), and
    ``ttft_log_se`` / ``speedup_log_se`` are the standard errors of the logs (what the
    trend weighs nights by). The speedup columns are filled on the ``cache == "on"`` rows
    only (the speedup is what turning the cache on buys, relative to the OFF row of the
    same placement and turn).
    The correctness counts are judged against the OFF arm on the same prompt
    (:func:`sessiongen.analysis.verdicts.correctness_cells`): ``cache_failures`` (pool-served
    divergences above the noise baseline), ``divergences`` (ON answers differing from OFF's,
    ``logprob_tol`` on first-token logprobs), ``pool_divergences`` (those the pool served)
    and ``on_only`` on ON rows, ``off_inconsistent`` on OFF rows; zero where
    nothing applies. This is what ``summary.csv`` and the nightly trend store hold.
    """
    cell = ["placement", "context_tokens", "turn"]
    arm = arm_turn_table(run, boot=boot)
    speed = speedup_table(run, boot=boot).select(
        *cell,
        "speedup",
        "speedup_ci_low",
        "speedup_ci_high",
        "speedup_log_se",
        speedup_sessions="n_units",
    )
    counts = correctness_cells(run, logprob_tol=logprob_tol)
    needle = needle_grades(run).select(*CELL_KEYS, needle_graded="graded", needle_correct="correct")
    out = (
        arm.join(speed, on=cell, how="left", nulls_equal=True)
        .join(counts, on=list(CELL_KEYS), how="left", nulls_equal=True)
        .join(needle, on=list(CELL_KEYS), how="left", nulls_equal=True)
    )
    on_rows = [
        pl.when(pl.col("cache") == "on").then(pl.col(c)).otherwise(None).alias(c)
        for c in SPEEDUP_COLUMNS
    ]
    return (
        out.with_columns(*on_rows, pl.col(*CELL_COUNTS).fill_null(0))
        .select(
            *CELL_KEYS,
            "n",
            "sessions",
            "errors",
            "median_ttft_s",
            "ci_low_s",
            "ci_high_s",
            "ttft_log_se",
            "p90_ttft_s",
            *SPEEDUP_COLUMNS,
            "contamination",
            "divergences",
            "pool_divergences",
            "needle_graded",
            "needle_correct",
            "cache_failures",
            "off_inconsistent",
            "on_only",
        )
        .sort(list(CELL_KEYS))
    )
