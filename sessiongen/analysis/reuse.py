"""A replayed trace's reuse: what the trace itself implies, and how much of it each arm got.

Pure functions of frames: the run's requests (records) and the trace's kept lines
(``trace_line``, ``hash_ids``), so they can be checked on hand-built frames. Definitions
(tokens are the trace's prompt tokens, ``content_tokens`` = the line's ``input_length``;
a *block* is one hash id, ``block_tokens`` tokens, the last one of a prompt maybe
partial; only requests with status ok count):

- **Infinite-cache tokens** of a request: its leading blocks whose hash id appeared in
  an earlier line of the trace, in tokens (``trace_shared_tokens``, recorded at replay,
  :mod:`sessiongen.workload.reuse`). Their sum over the trace's prompt tokens is the
  **infinite-cache share**: what one cache of unbounded size that every replica could
  read would have served.
- **Replica infinite-cache tokens**: the same, counting only blocks sent earlier *in the
  same block of the run to the same replica* (requests in the order they were sent):
  what unbounded local caches serve under the placement actually used. The difference
  from the infinite-cache tokens is reuse that only another replica had seen first:
  the most a shared pool can add to unbounded local caches.
- **Local hit tokens** and **pool hit tokens**: what the replicas' counters said each
  request got from its own prefix cache and from the pool (external), per arm.
- **Beyond local**: per request, ``max(0, infinite - local)``, the reuse the local
  cache left. **Recovered**: per request, ``min(pool, beyond local)``; the arm's
  **recovered share** is the recovered tokens over the beyond-local tokens ("the pool
  recovered X of the Y tokens an infinite cache could have served beyond the local
  hits"). Local and pool hits can exceed the trace's shared tokens by the chat
  template's tokens, which every prompt shares; the clamps keep those out.
- **Bounds**: the infinite share minus the replica share is what only another replica
  had seen, the most a pool adds to *unbounded* local caches. Real local caches evict,
  so a pool also serves blocks its replica saw and dropped: the measured pool share can
  exceed that difference (a Mooncake-trace plan: a pool share of 24.3% beside 23.5%).
  The bound a measured share is read against is therefore the **beyond-local share**
  (beyond local over prompt tokens, given the local hits as run), and the share read
  against it the **pool-within share** (recovered over prompt tokens), never above it.
- **Reuse distance** of a request (``trace_reuse_distance``, in blocks): the largest LRU
  stack distance among its shared blocks over the whole trace, so one LRU cache of C
  blocks that all requests go through serves its whole shared prefix exactly when the
  distance is below C. The **LRU share at C**: the infinite-cache tokens of requests
  whose distance is below C, over all infinite-cache tokens.
- **Working set** at a request's send time t: the distinct blocks referenced by the
  requests of the same run block sent in ``(t - window, t]``, over all replicas and on
  each replica; the **footprint** is the distinct blocks of the whole block (an
  unbounded window). Blocks count whole (``block_tokens`` each), an upper bound by less
  than one block a request.

- **Why not recovered** (:func:`recovery_causes`, ON arms, where the pool's chunk is
  known). The pool stores and serves whole chunks of ``chunk`` tokens counted from the
  prompt's start, so of a request's infinite-cache tokens at most the **chunked**
  ``floor(infinite / chunk) * chunk`` can come from it, and of those only what the local
  hits left: **in reach** ``max(0, chunked - local)``, never above beyond local. The
  rest of beyond local is **partial-chunk** tokens: the shared prefix's tail past its
  last whole chunk, all of it when the shared prefix is shorter than one chunk
  (**short** requests). **Missed**: in reach minus recovered (at least 0), whole chunks
  the pool did not hold when asked (evicted, or not yet stored: the request that writes
  them still running). The three add up to beyond local, up to the recovered tokens a
  chat template's few tokens move past a chunk boundary (counted as recovered).

Intervals take **sessions as units** (the turns of a session share a prefix and a
replica): :func:`sessiongen.analysis.hypotheses.clustered_share` on a session's tokens, over
the sessions with reuse beyond the local hits (the others add nothing to either sum, so
they are not resampled: ``interval_units`` counts those that are), for arms with at
least :data:`~sessiongen.analysis.stats.MIN_SESSIONS` of them; below that, none is given
("not enough data").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

from sessiongen.analysis import hypotheses, stats
from sessiongen.analysis.frames import partition

#: The columns of :func:`arm_reuse`'s table and their meaning (the report lists them).
ARM_COLUMNS: dict[str, str] = {
    "prompt_tokens": "the trace's prompt tokens of the arm's requests (all its blocks)",
    "infinite_share": "infinite-cache tokens / prompt tokens (blocks seen before anywhere)",
    "replica_share": "replica infinite-cache tokens / prompt tokens (seen before on that "
    "replica, placement as run)",
    "local_share": "local prefix-cache hit tokens / prompt tokens (replicas' counters)",
    "pool_share": "pool (external) hit tokens / prompt tokens (replicas' counters)",
    "beyond_local_tokens": "sum of max(0, infinite-cache - local hit) tokens per request",
    "beyond_local_share": "beyond local / prompt tokens: the most a pool could serve of the "
    "trace's shared prefixes beside the local hits as run (bounded local caches evict, so "
    "this can exceed infinite share - replica share)",
    "recovered_tokens": "sum of min(pool hit, beyond local) tokens per request",
    "pool_within_share": "recovered / prompt tokens: the pool's hits within the trace's "
    "shared prefixes beyond the local hits, never above beyond_local_share (pool_share "
    "also counts chat-template tokens every prompt shares, which the trace does not)",
    "recovered_share": "recovered / beyond local, 95% interval over interval_units",
    "interval_units": "the independent units the recovered share's interval resamples: "
    "sessions (a one-request session: a request) with reuse beyond the local hits",
}

_ARM = ["placement", "cache"]


def leading_seen_tokens(
    hash_lists: Sequence[Sequence[int]], lengths: Sequence[int], block_tokens: int
) -> list[int]:
    """For requests in order: the tokens of each one's leading blocks seen in an earlier
    request of the sequence (the last block may be partial: at most the request's length)."""
    seen: set[int] = set()
    out: list[int] = []
    for ids, length in zip(hash_lists, lengths, strict=True):
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        out.append(min(k * block_tokens, int(length)))
        seen.update(ids)
    return out


def _measured(requests: pl.DataFrame) -> pl.DataFrame:
    return requests.filter((pl.col("status") == "ok") & pl.col("trace_line").is_not_null())


def with_replica_reuse(
    requests: pl.DataFrame, lines: pl.DataFrame, block_tokens: int
) -> pl.DataFrame:
    """The ok trace requests with ``replica_shared_tokens``: the replica infinite-cache
    tokens (module doc), per run block and replica in send order; null where the replica
    is unknown (a router that did not say)."""
    rows = _measured(requests).join(
        lines.select("trace_line", "hash_ids"), on="trace_line", how="left"
    )
    rows = rows.with_row_index("_row").sort("block", "send_s", "_row")
    parts = []
    for _, sub in partition(rows, ["block", "replica"]):
        if sub["replica"][0] is None or sub["hash_ids"].null_count():
            shared = pl.Series("replica_shared_tokens", [None] * sub.height, pl.Int64)
        else:
            tokens = leading_seen_tokens(
                sub["hash_ids"].to_list(), sub["content_tokens"].to_list(), block_tokens
            )
            shared = pl.Series("replica_shared_tokens", tokens, pl.Int64)
        parts.append(sub.with_columns(shared))
    if not parts:
        return rows.with_columns(replica_shared_tokens=pl.lit(None, pl.Int64)).drop("_row")
    return pl.concat(parts).sort("_row").drop("_row", "hash_ids")


def _share(frame: pl.DataFrame, num: str, den: str) -> float | None:
    total = float(frame[den].sum() or 0)
    return float(frame[num].sum() or 0) / total if total > 0 else None


def arm_reuse(rows: pl.DataFrame) -> pl.DataFrame:
    """Per arm: the shares of :data:`ARM_COLUMNS` (``rows`` from :func:`with_replica_reuse`).

    ``recovered_low``/``recovered_high`` are null ("not enough data") when the arm has
    fewer than :data:`~sessiongen.analysis.stats.MIN_SESSIONS` sessions with reuse left
    beyond the local hits.
    """
    tokens = rows.with_columns(
        _infinite=pl.col("trace_shared_tokens").fill_null(0),
        _local=pl.col("local_hit_tokens").fill_null(0),
        _pool=pl.col("external_hit_tokens").fill_null(0),
    ).with_columns(_beyond=(pl.col("_infinite") - pl.col("_local")).clip(lower_bound=0))
    tokens = tokens.with_columns(_recovered=pl.min_horizontal("_pool", "_beyond"))
    out: list[dict[str, object]] = []
    for key, sub in partition(tokens, _ARM):
        per = sub.group_by("session_id").agg(pl.col("_recovered").sum(), pl.col("_beyond").sum())
        units = per.filter(pl.col("_beyond") > 0)
        low = high = None
        if units.height >= stats.MIN_SESSIONS:
            ci = hypotheses.clustered_share(
                units["_recovered"].to_numpy(), units["_beyond"].to_numpy()
            )
            low, high = ci.low, ci.high
        known = sub.filter(pl.col("replica_shared_tokens").is_not_null())
        out.append(
            {
                **key,
                "blocks": sub["block"].n_unique(),
                "sessions": sub["session_id"].n_unique(),
                "requests": sub.height,
                "prompt_tokens": int(sub["content_tokens"].sum()),
                "infinite_share": _share(sub, "_infinite", "content_tokens"),
                "replica_share": (
                    _share(known, "replica_shared_tokens", "content_tokens")
                    if known.height == sub.height
                    else None
                ),
                "local_share": _share(sub, "_local", "content_tokens"),
                "pool_share": _share(sub, "_pool", "content_tokens"),
                "beyond_local_tokens": int(sub["_beyond"].sum()),
                "beyond_local_share": _share(sub, "_beyond", "content_tokens"),
                "recovered_tokens": int(sub["_recovered"].sum()),
                "pool_within_share": _share(sub, "_recovered", "content_tokens"),
                "recovered_share": _share(sub, "_recovered", "_beyond"),
                "recovered_low": low,
                "recovered_high": high,
                "interval_units": units.height,
                "one_request_sessions": bool(per.height == sub.height),
            }
        )
    schema = {c: pl.Float64() for c in ("infinite_share", "replica_share", "local_share")}
    schema |= {c: pl.Float64() for c in ("pool_share", "recovered_share")}
    schema |= {c: pl.Float64() for c in ("beyond_local_share", "pool_within_share")}
    schema |= {"recovered_low": pl.Float64(), "recovered_high": pl.Float64()}
    return pl.DataFrame(out, schema_overrides=schema, infer_schema_length=None)


def recovery_causes(rows: pl.DataFrame, chunk_tokens: int) -> pl.DataFrame:
    """Per ON arm: where the tokens beyond the local hits went (module doc, "Why not
    recovered"): ``beyond_local_tokens`` = ``partial_chunk_tokens`` + ``missed_tokens``
    + ``recovered_in_reach``; ``short_requests`` of ``beyond_requests`` (requests with
    tokens beyond local) share less than one chunk. ``rows`` as for :func:`arm_reuse`."""
    infinite = pl.col("trace_shared_tokens").fill_null(0)
    local = pl.col("local_hit_tokens").fill_null(0)
    beyond = (infinite - local).clip(lower_bound=0)
    chunked = (infinite // chunk_tokens) * chunk_tokens
    reach = pl.min_horizontal((chunked - local).clip(lower_bound=0), beyond)
    recovered = pl.min_horizontal(pl.col("external_hit_tokens").fill_null(0), beyond)
    per = rows.filter(pl.col("cache") == "on").with_columns(
        _beyond=beyond, _reach=reach, _recovered=recovered, _short=infinite < chunk_tokens
    )
    schema = {
        "placement": pl.String(),
        "beyond_local_tokens": pl.Int64(),
        "partial_chunk_tokens": pl.Int64(),
        "missed_tokens": pl.Int64(),
        "recovered_tokens": pl.Int64(),
        "recovered_in_reach": pl.Int64(),
        "beyond_requests": pl.Int64(),
        "short_requests": pl.Int64(),
    }
    if per.is_empty():
        return pl.DataFrame(schema=schema)
    out = per.group_by("placement", maintain_order=True).agg(
        beyond_local_tokens=pl.col("_beyond").sum(),
        partial_chunk_tokens=(pl.col("_beyond") - pl.col("_reach")).sum(),
        missed_tokens=(pl.col("_reach") - pl.col("_recovered")).clip(lower_bound=0).sum(),
        recovered_tokens=pl.col("_recovered").sum(),
        recovered_in_reach=pl.min_horizontal("_recovered", "_reach").sum(),
        beyond_requests=(pl.col("_beyond") > 0).sum(),
        short_requests=((pl.col("_beyond") > 0) & pl.col("_short")).sum(),
    )
    return out.select(pl.col(c).cast(t) for c, t in schema.items()).sort("placement")


def trace_lines(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per trace line replayed (every run block replays the same lines, with the
    same trace facts): the lowest-numbered block's row of each line."""
    return _measured(rows).sort("block", "trace_line").unique("trace_line", keep="first")


def trace_totals(rows: pl.DataFrame) -> dict[str, float | int | None]:
    """The trace's own figures over its lines: requests, prompt tokens, infinite-cache
    tokens and share."""
    lines = trace_lines(rows)
    prompt = int(lines["content_tokens"].sum() or 0)
    infinite = int(lines["trace_shared_tokens"].fill_null(0).sum() or 0)
    return {
        "requests": lines.height,
        "prompt_tokens": prompt,
        "infinite_tokens": infinite,
        "infinite_share": infinite / prompt if prompt else None,
    }


def _bin_label(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def distance_histogram(rows: pl.DataFrame) -> pl.DataFrame:
    """Requests (trace lines) sharing a prefix, by reuse distance in blocks: bins 0, 1,
    2-3, 4-7, ... (powers of two), with their count and infinite-cache tokens."""
    shared = trace_lines(rows).filter(pl.col("trace_reuse_distance").is_not_null())
    schema = {"distance_blocks": pl.String(), "low": pl.Int64(), "requests": pl.Int64()}
    schema["shared_tokens"] = pl.Int64()
    if shared.is_empty():
        return pl.DataFrame(schema=schema)
    d = pl.col("trace_reuse_distance").cast(pl.Int64)
    low = pl.when(d == 0).then(0).otherwise(pl.lit(2).pow(d.log(2).floor()).cast(pl.Int64))
    binned = (
        shared.with_columns(low=low)
        .group_by("low")
        .agg(requests=pl.len(), shared_tokens=pl.col("trace_shared_tokens").sum().cast(pl.Int64))
    )
    binned = binned.sort("low").with_columns(
        distance_blocks=pl.col("low").map_elements(
            lambda v: _bin_label(v, max(v, 2 * v - 1)), return_dtype=pl.String
        )
    )
    return binned.select(list(schema))


def lru_share(rows: pl.DataFrame, capacity_blocks: float) -> float | None:
    """The LRU share at ``capacity_blocks`` (module doc); None when nothing is shared."""
    shared = trace_lines(rows).filter(pl.col("trace_reuse_distance").is_not_null())
    total = float(shared["trace_shared_tokens"].sum() or 0)
    if total <= 0:
        return None
    held = shared.filter(pl.col("trace_reuse_distance") < capacity_blocks)
    return float(held["trace_shared_tokens"].sum() or 0) / total


def distance_quantiles(rows: pl.DataFrame) -> dict[str, float | int | None]:
    """Sharing requests, and their reuse distance's median, p90 and largest (blocks)."""
    d = trace_lines(rows)["trace_reuse_distance"].drop_nulls().cast(pl.Float64)
    if d.is_empty():
        return {"sharing_requests": 0, "p50": None, "p90": None, "max": None}
    return {
        "sharing_requests": d.len(),
        "p50": d.quantile(0.5, "nearest"),
        "p90": d.quantile(0.9, "nearest"),
        "max": d.quantile(1.0, "nearest"),
    }


def working_set(
    requests: pl.DataFrame, lines: pl.DataFrame, window_s: float | None = None
) -> pl.DataFrame:
    """At each request's send, per run block: the distinct blocks referenced in
    ``(t - window_s, t]`` over all replicas (``all_blocks``) and on the busiest replica
    (``replica_blocks``, null where a router left replicas unknown); ``t_s`` from the
    block's first send. ``window_s`` None: a tenth of each block's span of sends (the
    column ``window_s`` says which; unbounded when that is 0)."""
    rows = _measured(requests).join(
        lines.select("trace_line", "hash_ids"), on="trace_line", how="inner"
    )
    out: list[dict[str, object]] = []
    for key, sub in partition(rows.sort("block", "send_s"), ["block", "placement", "cache"]):
        start = float(sub["send_s"][0])
        times = [float(t) - start for t in sub["send_s"].to_list()]
        span = times[-1]
        window = window_s if window_s is not None else span / 10
        window = window if window > 0 else math.inf  # one send, or all at once
        out += [{**key, "window_s": window, **p} for p in _sliding(sub, times, window)]
    schema = {"window_s": pl.Float64(), "t_s": pl.Float64(), "all_blocks": pl.Int64()}
    schema["replica_blocks"] = pl.Int64()
    return pl.DataFrame(out, schema_overrides=schema, infer_schema_length=None)


def _sliding(sub: pl.DataFrame, times: list[float], window: float) -> list[dict[str, float | None]]:
    """The sliding-window distinct counts of one run block (reference counts per block id)."""
    ids: list[list[int]] = sub["hash_ids"].to_list()
    replicas: list[int | None] = sub["replica"].to_list()
    known = None not in replicas
    everywhere: dict[int, int] = {}
    per: dict[int | None, dict[int, int]] = {}
    first = 0
    out: list[dict[str, float | None]] = []
    for i, t in enumerate(times):
        for h in ids[i]:
            everywhere[h] = everywhere.get(h, 0) + 1
            counts = per.setdefault(replicas[i], {})
            counts[h] = counts.get(h, 0) + 1
        while first < i and times[first] <= t - window:  # window (t - w, t]: drop what left it
            for h in ids[first]:
                _release(everywhere, h)
                _release(per[replicas[first]], h)
            first += 1
        busiest = max(len(c) for c in per.values()) if known else None
        out.append({"t_s": t, "all_blocks": len(everywhere), "replica_blocks": busiest})
    return out


def _release(counts: dict[int, int], h: int) -> None:
    counts[h] -= 1
    if not counts[h]:
        del counts[h]


def footprint(requests: pl.DataFrame, lines: pl.DataFrame) -> pl.DataFrame:
    """Per run block: the distinct blocks of all its requests, and on its busiest replica."""
    rows = _measured(requests).join(
        lines.select("trace_line", "hash_ids"), on="trace_line", how="inner"
    )
    ex = rows.explode("hash_ids")
    every = ex.group_by("block", "placement", "cache").agg(all_blocks=pl.col("hash_ids").n_unique())
    busy = (
        ex.group_by("block", "replica")
        .agg(n=pl.col("hash_ids").n_unique(), unknown=pl.col("replica").is_null().any())
        .group_by("block")
        .agg(replica_blocks=pl.when(~pl.col("unknown").any()).then(pl.col("n").max()))
    )
    return every.join(busy, on="block", how="left").sort("block")
