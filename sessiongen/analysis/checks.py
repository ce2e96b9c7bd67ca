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
  :mod:`sessiongen.workload.traceprompts`). ``trace_shared_tokens`` counts only what
  *earlier lines* of the trace share; a request that waited in the server's queue while
  a *later* line sharing its blocks was admitted and computed them finds them cached on
  admission, legitimately. So a trace's first turn over its allowance is not flagged when
  another request of the same run block (the same replica in a cache-off arm), of a
  later trace line and at least as long as the hit, had its first token (its prefill
  done) before this request's admission (``send_s + server_queue_s``; where the server
  did not say, its first token, the latest it can have been admitted).
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


_HITS = ("cached_tokens", "local_hit_tokens", "external_hit_tokens")
#: A request's identity within a run (a row key for :func:`_computed_by_another`).
_ROW = ("block", "session_id", "turn")


def _cold(run: Run) -> pl.Expr:
    """A first turn hit more than its allowance."""
    allow = _allowance(run)
    return (pl.col("turn") == 1) & pl.any_horizontal(
        [pl.col(c).fill_null(0) > allow for c in _HITS]
    )


def _row_key() -> pl.Expr:
    return pl.concat_str([pl.col(c).cast(pl.String).fill_null("") for c in _ROW], separator="|")


def _computed_by_another(run: Run) -> pl.Expr:
    """Boolean expression: a trace's cold first turn whose hit another request computed
    before its admission (the module doc: it queued, it was not contaminated)."""
    if not run.trace or run.requests.is_empty():
        return pl.lit(False)
    req = run.requests.with_columns(
        _hit=pl.max_horizontal([pl.col(c).fill_null(0) for c in _HITS]),
        _key=_row_key(),
    )
    cand = req.filter(_cold(run)).select(
        "block", "cache", "replica", "trace_line", "_hit", "_key",
        _admit=pl.col("send_s") + pl.coalesce("server_queue_s", "ttft_s"),
    )  # fmt: skip
    if cand.is_empty():
        return pl.lit(False)
    done = req.filter(pl.col("ttft_s").is_not_null() & pl.col("trace_line").is_not_null()).select(
        "block",
        pl.col("replica").alias("_o_replica"),
        pl.col("trace_line").alias("_o_line"),
        pl.col("prompt_tokens").fill_null(0).alias("_o_prompt"),
        (pl.col("send_s") + pl.col("ttft_s")).alias("_o_done"),
    )
    same_replica = (pl.col("cache") != "off") | (pl.col("_o_replica") == pl.col("replica"))
    explained = cand.join(done, on="block").filter(
        (pl.col("_o_line") > pl.col("trace_line"))
        & (pl.col("_o_done") < pl.col("_admit"))
        & (pl.col("_o_prompt") >= pl.col("_hit"))
        & same_replica.fill_null(False)
    )
    keys = explained["_key"].unique().to_list()
    return _row_key().is_in(keys) if keys else pl.lit(False)


def contamination_expr(run: Run) -> pl.Expr:
    """Boolean expression: this request shows a cache hit where none should be."""
    cold = _cold(run) & ~_computed_by_another(run)
    off_external = (pl.col("cache") == "off") & (pl.col("external_hit_tokens").fill_null(0) > 0)
    return cold | off_external


def contamination(run: Run) -> pl.DataFrame:
    """The contaminated requests, one row each, with the reason."""
    flagged = run.requests.filter(contamination_expr(run))
    cold = _cold(run)
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
