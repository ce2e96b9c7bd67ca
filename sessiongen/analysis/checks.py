"""Checks that a run can be trusted: cache contamination, attribution, correctness probes.

- **Contamination** = cache hits where none should be: on turn 1 (cold) rows, cached,
  local-hit or external-hit tokens above ``scenario.sessions.shared_prefix_tokens`` (the
  only prefix sessions may legitimately share); and any external (shared-pool) hit in a
  cache-off arm. Cross-replica turns of OFF arms may still hit the replica's own prefix
  cache (turn k-2 ran there under ``alternate``), so local hits there are not flagged.
  A trace's first turns may share what the trace says they share with earlier requests:
  their allowance is ``trace_shared_tokens``, plus the chat template around the content
  (``prompt_tokens - content_tokens``: the template's head is shared too) and 2 (blocks
  whose ids are congruent modulo the head-word pool share up to two head tokens,
  :mod:`sessiongen.workload.traceprompts`).
- **Cache attribution** = mean prompt, cached (server ``usage``), local-hit and
  external-hit tokens (``/metrics`` deltas, where attributable) per request, per arm and
  turn.
- **Needle grading**: rows with a graded answer (``answer_correct`` not null).
- **Correctness** (needle and equivalence probes, counted against the OFF arm on the
  same prompt) lives in :mod:`sessiongen.analysis.correctness` and
  :mod:`sessiongen.analysis.verdicts`.
"""

from __future__ import annotations

import polars as pl

from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run


def _allowance(run: Run) -> pl.Expr:
    """Tokens a first turn may legitimately hit (see the module doc)."""
    base = pl.lit(run.shared_prefix_tokens)
    if not run.trace:
        return base
    template = (pl.col("prompt_tokens") - pl.col("content_tokens")).fill_null(0).clip(0)
    said = pl.col("trace_shared_tokens").fill_null(0) + template + 2
    return pl.max_horizontal(base, said)


def contamination_expr(run: Run) -> pl.Expr:
    """Boolean expression: this request shows a cache hit where none should be."""
    allow = _allowance(run)
    hits = [
        pl.col(c).fill_null(0) for c in ("cached_tokens", "local_hit_tokens", "external_hit_tokens")
    ]
    cold = (pl.col("turn") == 1) & pl.any_horizontal([h > allow for h in hits])
    off_external = (pl.col("cache") == "off") & (pl.col("external_hit_tokens").fill_null(0) > 0)
    return cold | off_external


def contamination(run: Run) -> pl.DataFrame:
    """The contaminated requests, one row each, with the reason."""
    allow = _allowance(run)
    flagged = run.requests.filter(contamination_expr(run))
    cold = (pl.col("turn") == 1) & pl.any_horizontal(
        [
            pl.col(c).fill_null(0) > allow
            for c in ("cached_tokens", "local_hit_tokens", "external_hit_tokens")
        ]
    )
    reason = (
        pl.when(cold)
        .then(
            pl.lit("cold first turn hit more than the trace says it shares")
            if run.trace
            else pl.lit(f"cold first turn hit > {run.shared_prefix_tokens} tokens")
        )
        .otherwise(pl.lit("external hit with cache off"))
    )
    cols = [
        "placement",
        "cache",
        "context_tokens",
        "block",
        "session_id",
        "turn",
        "replica",
        "cached_tokens",
        "local_hit_tokens",
        "external_hit_tokens",
    ]
    return flagged.select(*cols, reason.alias("reason")).sort("block", "session_id", "turn")


def cache_attribution(run: Run) -> pl.DataFrame:
    """Per arm and turn: mean prompt, cached, local-hit and external-hit tokens per request."""
    keys = list(CELL_KEYS)
    return (
        run.requests.with_columns(contamination_expr(run).alias("_contaminated"))
        .group_by(keys)
        .agg(
            n=pl.len(),
            attributed=(
                pl.col("local_hit_tokens").is_not_null()
                | pl.col("external_hit_tokens").is_not_null()
            ).sum(),
            prompt_tokens=pl.col("prompt_tokens").mean(),
            cached_tokens=pl.col("cached_tokens").mean(),
            local_hit_tokens=pl.col("local_hit_tokens").mean(),
            external_hit_tokens=pl.col("external_hit_tokens").mean(),
            contamination=pl.col("_contaminated").sum(),
        )
        .with_columns(hit_fraction=pl.col("cached_tokens") / pl.col("prompt_tokens"))
        .sort(keys)
    )


def needle_grades(run: Run) -> pl.DataFrame:
    """Per arm and turn: needle answers graded, correct, and the rate."""
    graded = run.requests.filter(pl.col("answer_correct").is_not_null())
    return (
        graded.group_by(list(CELL_KEYS))
        .agg(graded=pl.len(), correct=pl.col("answer_correct").sum())
        .with_columns(rate=pl.col("correct") / pl.col("graded"))
        .sort(list(CELL_KEYS))
    )
