"""Which requests asked the same prompt, and which were served from the shared pool.

Correctness is judged by comparing answers, and answers are comparable only between
requests whose prompts are identical. This module gives every usable request (status
ok, see :attr:`Run.ok`) two facts the correctness checks build on:

- ``prompt_key``: equal for two requests exactly when they sent the same prompt.
  Schema 2 records carry ``prompt_digest`` (a digest of the exact messages sent), which
  is the key. A session id is not: targets that cannot restart (endpoints, the simulated
  pair with ``design.restart_between_blocks = false``) give every block its own salt, and
  the salt changes the marker at the head of every context, so the "same" session sends
  a different prompt in each block. Schema 1 runs have no digest; for them the key is
  (the block's salt from the manifest, session, turn), which names one prompt when the
  history is ``frozen`` or ``none`` and, with ``live`` history, on turn 1 only (later
  turns carry the server's own answers). Rows with neither get a key of their own and
  are compared with nothing (:attr:`KeyedRequests.unkeyed` counts them).
- ``pool_served``: an ON request on a cross-replica turn that the shared pool served,
  i.e. with external hits (``external_hit_tokens > 0``). Per-request counts are exact
  only when requests to a replica never overlap (``driver.concurrency = 1``); where
  they are null, the block's own counters stand in (the replicas'
  ``vllm:external_prefix_cache_hits_total`` rose during the block), and
  ``pool_evidence`` says which: ``request``, ``block`` or null (unknown: not served).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from sessiongen.records.counters import EXTERNAL_HITS
from sessiongen.records.run import Run

#: How prompts were matched: by digest of the exact prompt, by the schema-1 fallback.
BASIS_DIGEST = "prompt digest"
BASIS_SESSION = "block salt, session and turn (schema 1 records have no prompt digest)"
BASIS_NONE = "none (no prompt digest and no block salt in the manifest)"


@dataclass(frozen=True)
class KeyedRequests:
    """A run's usable requests with ``prompt_key``, ``pool_served`` and ``pool_evidence``.

    ``basis`` says how prompts were matched (one of the ``BASIS_*`` texts); ``unkeyed``
    counts requests that could be matched with nothing.
    """

    rows: pl.DataFrame
    basis: str
    unkeyed: int


def _block_salts(run: Run) -> pl.DataFrame:
    """Block -> the salt its prompts were built with (from the manifest's blocks)."""
    pairs = [
        (int(b["block"]), str(b["salt"]))
        for b in run.meta.blocks
        if b.get("block") is not None and b.get("salt")
    ]
    return pl.DataFrame(
        {"block": [b for b, _s in pairs], "_salt": [s for _b, s in pairs]},
        schema={"block": pl.Int32(), "_salt": pl.String()},
    )


def block_pool_hits(run: Run) -> pl.DataFrame:
    """Block -> external (shared-pool) hit tokens over all replicas, from ``metrics.parquet``."""
    schema = {"block": pl.Int32(), "_block_pool_hits": pl.Float64()}
    metrics = run.metrics
    if metrics is None or metrics.is_empty() or "metric" not in metrics.columns:
        return pl.DataFrame(schema=schema)
    counter = metrics.filter(pl.col("metric") == EXTERNAL_HITS)
    signed = pl.when(pl.col("moment") == "after").then(pl.col("value")).otherwise(-pl.col("value"))
    return (
        counter.group_by("block", "replica")
        .agg(delta=signed.sum(), moments=pl.col("moment").n_unique())
        .filter(pl.col("moments") == 2)  # a before and an after
        .group_by("block")
        .agg(_block_pool_hits=pl.col("delta").sum())
        .select(pl.col("block").cast(pl.Int32), pl.col("_block_pool_hits").cast(pl.Float64))
    )


def _fallback_key(live_history: bool) -> pl.Expr:
    """The schema-1 prompt key: (block salt, session, turn), where that names one prompt."""
    usable = pl.col("_salt").is_not_null() & pl.col("session_id").is_not_null()
    if live_history:
        usable = usable & (pl.col("turn") == 1)
    key = pl.concat_str(
        [pl.col("_salt"), pl.col("session_id"), pl.col("turn").cast(pl.String)], separator="/"
    )
    return pl.when(usable).then(key)


def _pool_columns() -> list[pl.Expr]:
    exact = pl.col("external_hit_tokens").is_not_null()
    block_known = pl.col("_block_pool_hits").is_not_null()
    candidate = (pl.col("cache") == "on") & pl.col("cross_replica").fill_null(False)
    served = (
        pl.when(exact)
        .then(pl.col("external_hit_tokens") > 0)
        .otherwise(pl.col("_block_pool_hits").fill_null(0) > 0)
    )
    evidence = pl.when(exact).then(pl.lit("request")).when(block_known).then(pl.lit("block"))
    return [
        (candidate & served).alias("pool_served"),
        evidence.otherwise(None).alias("pool_evidence"),
    ]


def keyed_requests(run: Run) -> KeyedRequests:
    """The run's usable requests with their prompt keys and pool evidence (module doc)."""
    live = run.meta.sessions.get("history") == "live"
    rows = (
        run.ok.with_row_index("_row")
        .join(_block_salts(run), on="block", how="left")
        .join(block_pool_hits(run), on="block", how="left")
    )
    key = pl.coalesce(pl.col("prompt_digest"), _fallback_key(live))
    rows = rows.with_columns(*_pool_columns(), _key=key)
    unkeyed = int(rows["_key"].null_count())
    own = pl.concat_str([pl.lit("unkeyed/"), pl.col("_row").cast(pl.String)])
    rows = rows.with_columns(prompt_key=pl.coalesce(pl.col("_key"), own)).drop(
        "_row", "_key", "_salt", "_block_pool_hits"
    )
    if run.ok["prompt_digest"].null_count() < run.ok.height:
        basis = BASIS_DIGEST
    elif unkeyed < rows.height:
        basis = BASIS_SESSION
    else:
        basis = BASIS_NONE
    return KeyedRequests(rows, basis, unkeyed)
