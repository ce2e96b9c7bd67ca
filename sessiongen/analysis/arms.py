"""Is each block in the cache arm it is labeled with? Checked from counters, not believed.

A block's arm is what the user said (``--cache``, the pair it went to, the switch
command) or what sessiongen set. What the replicas did is in the records:

- **ON**: a cross-replica request (a turn whose previous turn ran on the other replica,
  or a warm-up's second hop) of at least two pool chunks (the target's where the
  manifest says it, else LMCache's default of 256 tokens) finds its prefix in the
  shared pool, so the block shows external hits. An ON block that shows none (per
  request where the counts are exact, and over the whole block in ``metrics.parquet``)
  although it sent such requests, or whose replicas say they have no KV connector, is
  *mislabeled*. Without such a request (placement ``fixed`` and no warm-up long enough)
  it is *unchecked*. Warm-ups count only where the pool's chunk is known: for given
  endpoints they are 512 tokens, maybe less than one chunk of the user's pool.
- **OFF**: no request may show external hits (any, on any request, or in the block's
  counters), and no replica may say it has a KV connector; else the block is
  *mislabeled*.
- A block without counters of any kind (a server without vLLM's metrics) is *unchecked*.

What a replica says of its connector is the block's ``kv_connector`` entry in the
manifest (vLLM's ``/server_info`` in dev mode, the simulator's info gauge); most vLLM
deployments say nothing, and the counters decide alone.

Warm-up rows are read from ``requests.parquet`` itself (:func:`load_run` drops them):
their second hop is the one cross-replica request every block has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import polars as pl

from sessiongen.analysis.prompts import block_pool_hits
from sessiongen.errors import RunDirError
from sessiongen.records import io
from sessiongen.records.run import Run

#: LMCache's default chunk (tokens), when the manifest does not say the pool's.
DEFAULT_POOL_CHUNK = 256
MISLABELED, OK, UNCHECKED = "mislabeled", "ok", "unchecked"

ARM_CHECK_SCHEMA: dict[str, pl.DataType] = {
    "block": pl.Int32(),
    "placement": pl.String(),
    "cache": pl.String(),
    "cross_requests": pl.Int64(),
    "attributed": pl.Int64(),
    "external_hit_tokens": pl.Int64(),
    "block_external_hits": pl.Int64(),
    "replicas_say": pl.String(),
    "status": pl.String(),
    "evidence": pl.String(),
}


class BlockCounts(TypedDict):
    """What one block's requests and counters show of its cache arm (before judging)."""

    block: int
    placement: str
    cache: str
    cross_requests: int
    cross_attributed: int
    attributed: int
    external_hit_tokens: int
    block_external_hits: int | None  # the replicas' counters over the block, where read
    replicas_say: str | None  # on | off | mixed, where the replicas said


def pool_chunk_tokens(run: Run) -> int | None:
    """The shared pool's chunk, where the manifest tells it (sim profile, managed spec)."""
    target = run.meta.target
    for section, key in (("profile", "pool_chunk_tokens"), ("spec", "chunk_size")):
        value = (target.get(section) or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _all_rows(run: Run) -> pl.DataFrame:
    """Measured and warm-up requests (tokens only), from the run folder where it has one."""
    cols = {
        "block": pl.Int32(),
        "warmup": pl.Boolean(),
        "status": pl.String(),
        "cross_replica": pl.Boolean(),
        "prompt_tokens": pl.Int64(),
        "external_hit_tokens": pl.Int64(),
    }
    try:
        raw = io.read_requests(run.path)
    except RunDirError:
        raw = run.requests
    for name, dtype in cols.items():
        if name not in raw.columns:
            raw = raw.with_columns(pl.lit(None, dtype=dtype).alias(name))
    return raw.select(pl.col(n).cast(t) for n, t in cols.items())


def replicas_say(entry: Mapping[str, Any]) -> str | None:
    """The arm a block's replicas said they were in: on, off, mixed, or None (silent)."""
    said = {
        c.get("configured")
        for c in entry.get("kv_connector") or []
        if isinstance(c, dict) and isinstance(c.get("configured"), bool)
    }
    if not said:
        return None
    if len(said) > 1:
        return "mixed"
    return "on" if said.pop() else "off"


def _tokens(n: int) -> str:
    return f"{n:,} external hit token{'s' if n != 1 else ''}"


def _judge(row: BlockCounts, min_tokens: int) -> tuple[str, str]:
    """(status, evidence) of one block (module doc)."""
    cache, hits, block_hits = row["cache"], row["external_hit_tokens"], row["block_external_hits"]
    said = row["replicas_say"]
    parts = [f"{row['attributed']} requests with exact counts: {_tokens(hits)}"]
    if cache == "on":
        parts.append(
            f"{row['cross_requests']} cross-replica requests of at least {min_tokens:,} "
            f"prompt tokens ({row['cross_attributed']} with exact counts)"
        )
    if block_hits is not None:
        parts.append(f"the replicas' counters moved {_tokens(block_hits)} over the block")
    if said is not None:
        words = {"on": "a KV connector", "off": "no KV connector", "mixed": "mixed"}
        parts.append(f"the replicas say: {words[said]}")
    evidence = f"block {row['block']} ({row['placement']}, labeled cache {cache}): " + "; ".join(
        parts
    )
    seen = hits > 0 or (block_hits or 0) > 0
    if cache == "on":
        if seen:
            return OK, evidence
        counted = row["cross_attributed"] > 0 or (
            row["cross_requests"] > 0 and block_hits is not None
        )
        return (MISLABELED if counted or said in ("off", "mixed") else UNCHECKED), evidence
    if seen or said in ("on", "mixed"):
        return MISLABELED, evidence
    return (OK if row["attributed"] > 0 or block_hits is not None else UNCHECKED), evidence


def arm_check(run: Run) -> pl.DataFrame:
    """One row per block that ran: its label, the evidence, and a status
    (:data:`OK`, :data:`MISLABELED`, :data:`UNCHECKED`); see the module doc."""
    entries = {
        int(b["block"]): b
        for b in run.meta.blocks
        if b.get("block") is not None and b.get("cache") in ("on", "off")
    }
    if not entries:
        return pl.DataFrame(schema=ARM_CHECK_SCHEMA)
    chunk = pool_chunk_tokens(run)
    min_tokens = 2 * (chunk or DEFAULT_POOL_CHUNK)
    rows = _all_rows(run).filter(pl.col("status") == "ok")
    exact = pl.col("external_hit_tokens").is_not_null()
    # A warm-up is as long as two of the target's pool chunks where the target knows
    # them, else 512 tokens, which may be shorter than one chunk of the user's pool.
    proof = pl.lit(True) if chunk is not None else ~pl.col("warmup").fill_null(False)
    cross = (
        pl.col("cross_replica").fill_null(False)
        & (pl.col("prompt_tokens").fill_null(0) >= min_tokens)
        & proof
    )
    per_block = rows.group_by("block").agg(
        cross_requests=cross.sum(),
        cross_attributed=(cross & exact).sum(),
        attributed=exact.sum(),
        external_hit_tokens=pl.col("external_hit_tokens").filter(exact).sum(),
    )
    by_block = {int(r["block"]): r for r in per_block.iter_rows(named=True)}
    pool = {int(b): int(v) for b, v in block_pool_hits(run).iter_rows()}
    out: list[dict[str, object]] = []
    for block, entry in sorted(entries.items()):
        counts = by_block.get(block)
        if counts is None and block not in pool:
            continue  # nothing ran (a block that failed to start)
        counts = counts or {}
        row: BlockCounts = {
            "block": block,
            "placement": str(entry.get("placement")),
            "cache": str(entry["cache"]),
            "cross_requests": int(counts.get("cross_requests") or 0),
            "cross_attributed": int(counts.get("cross_attributed") or 0),
            "attributed": int(counts.get("attributed") or 0),
            "external_hit_tokens": int(counts.get("external_hit_tokens") or 0),
            "block_external_hits": pool.get(block),
            "replicas_say": replicas_say(entry),
        }
        status, evidence = _judge(row, min_tokens)
        out.append({**row, "status": status, "evidence": evidence})  # the schema's columns
    return pl.DataFrame(out, schema=ARM_CHECK_SCHEMA)


def mislabeled_arms(run: Run) -> list[str]:
    """The evidence of every mislabeled block, one line each (empty: none)."""
    check = arm_check(run).filter(pl.col("status") == MISLABELED)
    return [str(e) for e in check["evidence"].to_list()]
