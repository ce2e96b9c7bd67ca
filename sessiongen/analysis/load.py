"""A run under load: saturation, goodput, the load each arm sustains, working set, reuse.

Definitions (all durations in modeled seconds; a *level* is a block's load level: the
concurrency of a closed loop or the session start rate of an open loop):

- **Offered load**: the level. **Throughput**: completed turns per modeled second over
  the span of each block (first send to last end), summed over an arm's blocks of the
  level and divided by their spans' sum.
- **Tails**: p50 with its sample count; p90 as MLPerf LoadGen's early-stopping
  estimate (:mod:`sessiongen.analysis.tails`), or "not enough samples".
- **Goodput** against the scenario's ``[objective]``: the share of turns whose TTFT is
  at most ``ttft_s`` (``good_turns``, with a Wilson 95% interval) and the share of whole
  sessions all of whose turns are (``good_sessions``). An arm **meets** the objective
  at a level when ``good_turns >= attainment``.
- **Sustained load** of an arm: the highest level at which it meets the objective;
  ``sure`` is the highest level at which the Wilson interval lies wholly above the
  attainment (below it the arm surely meets it), ``fails`` the lowest level at which it
  lies wholly below (from there on it surely does not). The truth is between.
- **Working set** of a block: at each request's send, the prompt tokens of the newest
  turn of every session that has started and not ended (distinct prefixes: sessions
  share none but a shared system prompt, counted once). Per replica: the sessions that
  have visited it. Reported at its peak, against the replica's KV capacity and the
  pool's capacity where the target says them.
- **Reuse distance** of a turn: the prompt tokens the same replica was sent between the
  session's previous turn there and this one. Past the replica's KV capacity, LRU has
  evicted the prefix (a local miss is expected); null on a session's first visit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from sessiongen.analysis.frames import partition
from sessiongen.analysis.tails import tail
from sessiongen.records.run import Run

#: The keys of one arm at one level.
LEVEL_KEYS = ("placement", "cache", "context_tokens", "load_level")


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (Wilson 1927); (nan, nan) when ``n`` is 0."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _with_level(run: Run) -> pl.DataFrame:
    """Requests with a ``load_level`` (runs before load sweeps: one level, 1)."""
    return run.requests.with_columns(pl.col("load_level").fill_null(1.0))


def _throughput(rows: pl.DataFrame) -> float | None:
    """Completed turns per modeled second over the blocks' spans."""
    ok = rows.filter((pl.col("status") == "ok") & pl.col("e2e_s").is_not_null())
    spans = ok.group_by("block").agg(
        n=pl.len(), span=(pl.col("send_s") + pl.col("e2e_s")).max() - pl.col("send_s").min()
    )
    total = float(spans["span"].sum() or 0.0)
    return float(spans["n"].sum()) / total if total > 0 else None


def load_table(run: Run, ttft_s: float | None, attainment: float = 0.9) -> pl.DataFrame:
    """Per arm and level: samples, p50 and p90 (early stopping), throughput, goodput."""
    rows: list[dict[str, Any]] = []
    for key, sub in partition(_with_level(run), LEVEL_KEYS):
        ok = sub.filter((pl.col("status") == "ok") & pl.col("ttft_s").is_not_null())
        ttft = ok["ttft_s"].to_numpy().astype(np.float64)
        p90 = tail(ttft, 0.9)
        row: dict[str, Any] = {
            **key,
            "turns": sub.height,
            "errors": int((sub["status"] != "ok").sum()),
            "p50_ttft_s": float(np.median(ttft)) if ttft.size else None,
            "p90_ttft_s": p90.bound,
            "p90_note": p90.text(),
            "median_queue_s": ok["queue_s"].median(),
            "throughput_turns_s": _throughput(sub),
        }
        row.update(_goodput(sub, ttft_s, attainment))
        rows.append(row)
    return pl.DataFrame(rows, schema_overrides=_LOAD_SCHEMA, infer_schema_length=None)


_LOAD_SCHEMA: dict[str, pl.DataType] = {
    "p50_ttft_s": pl.Float64(),
    "p90_ttft_s": pl.Float64(),
    "median_queue_s": pl.Float64(),
    "throughput_turns_s": pl.Float64(),
    "good_turns": pl.Float64(),
    "good_turns_low": pl.Float64(),
    "good_turns_high": pl.Float64(),
    "good_sessions": pl.Float64(),
    "meets": pl.Boolean(),
}


def _goodput(sub: pl.DataFrame, ttft_s: float | None, attainment: float) -> dict[str, Any]:
    """Good turns and sessions against the objective (a failed turn is never good)."""
    if ttft_s is None:
        return dict.fromkeys(
            ("good_turns", "good_turns_low", "good_turns_high", "good_sessions", "meets")
        )
    good = (pl.col("status") == "ok") & (pl.col("ttft_s") <= ttft_s)
    flagged = sub.with_columns(good=good.fill_null(False))
    n, hits = flagged.height, int(flagged["good"].sum())
    low, high = wilson(hits, n)
    per_session = flagged.group_by("block", "session_id").agg(all_good=pl.col("good").all())
    share = hits / n if n else None
    return {
        "good_turns": share,
        "good_turns_low": low,
        "good_turns_high": high,
        "good_sessions": float(per_session.select(pl.col("all_good").mean()).item()) if n else None,
        "meets": None if share is None else share >= attainment,
    }


def sustained_load(table: pl.DataFrame, attainment: float = 0.9) -> pl.DataFrame:
    """Per arm: the highest level meeting the objective, and where that is sure."""
    rows = []
    arm = ["placement", "cache", "context_tokens"]
    for key, sub in partition(table.filter(pl.col("meets").is_not_null()), arm):
        sub = sub.sort("load_level")
        levels = sub["load_level"].to_list()
        meets = sub["meets"].to_list()
        low, high = sub["good_turns_low"].to_list(), sub["good_turns_high"].to_list()
        sure = [lv for lv, lo in zip(levels, low, strict=True) if lo >= attainment]
        fails = [lv for lv, hi in zip(levels, high, strict=True) if hi < attainment]
        passing = [lv for lv, ok in zip(levels, meets, strict=True) if ok]
        rows.append(
            {
                **key,
                "sustains": max(passing) if passing else None,
                "sure": max(sure) if sure else None,
                "fails": min(fails) if fails else None,
                "levels": len(levels),
            }
        )
    schema = {"sustains": pl.Float64(), "sure": pl.Float64(), "fails": pl.Float64()}
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def reuse_distance(run: Run) -> pl.DataFrame:
    """The requests with ``reuse_distance_tokens`` (see the module docstring)."""
    rows = run.requests.filter(pl.col("send_s").is_not_null()).sort("send_s")
    tokens = pl.col("prompt_tokens").fill_null(pl.col("content_tokens")).fill_null(0)
    rows = rows.with_columns(_tokens=tokens).with_columns(
        _cum=pl.col("_tokens").cum_sum().over("block", "replica", order_by="send_s")
    )
    before = pl.col("_cum") - pl.col("_tokens")  # served on the replica before this send
    prev_after = pl.col("_cum").shift(1).over("block", "session_id", "replica", order_by="send_s")
    return rows.with_columns(reuse_distance_tokens=before - prev_after).drop("_tokens", "_cum")


def reuse_summary(run: Run) -> pl.DataFrame:
    """Per arm, level and turn: median reuse distance and the local hit share of prompts."""
    rows = reuse_distance(run).with_columns(pl.col("load_level").fill_null(1.0))
    keys = ["placement", "cache", "context_tokens", "load_level", "turn"]
    return (
        rows.group_by(keys)
        .agg(
            n=pl.len(),
            median_reuse_tokens=pl.col("reuse_distance_tokens").median(),
            local_hit_share=(pl.col("local_hit_tokens").sum() / pl.col("prompt_tokens").sum()),
            external_hit_share=(
                pl.col("external_hit_tokens").sum() / pl.col("prompt_tokens").sum()
            ),
        )
        .sort(keys)
    )


def working_set(run: Run) -> pl.DataFrame:
    """Per block: peak working set over all replicas and the largest per replica."""
    rows = run.requests.filter(pl.col("send_s").is_not_null())
    out = []
    for key, block in partition(rows, ["block", "placement", "cache", "load_level"]):
        peak_all, peak_replica = _peaks(block, run.shared_prefix_tokens)
        out.append({**key, "peak_tokens": peak_all, "peak_replica_tokens": peak_replica})
    return pl.DataFrame(out, infer_schema_length=None)


def _peaks(block: pl.DataFrame, shared: int) -> tuple[int, int]:
    """Peak live prefix tokens over all replicas, and on the busiest replica."""
    tokens = block["prompt_tokens"].fill_null(block["content_tokens"]).fill_null(0).to_list()
    events = sorted(
        zip(
            block["send_s"].to_list(),
            (block["send_s"] + block["e2e_s"].fill_null(0)).to_list(),
            block["session_id"].to_list(),
            block["replica"].to_list(),
            tokens,
            strict=True,
        )
    )
    ends: dict[str, float] = {}
    for send, end, session, *_ in events:
        ends[session] = max(ends.get(session, send), end)
    live: dict[str, int] = {}
    visited: dict[str, set[int]] = {}
    peak_all = peak_replica = 0
    for send, _end, session, replica, size in events:
        live = {s: t for s, t in live.items() if ends[s] >= send}
        live[session] = int(size)
        if replica is not None:  # a router may have left it unknown
            visited.setdefault(session, set()).add(int(replica))
        total = sum(live.values())
        peak_all = max(peak_all, total + (shared if live else 0))
        per: dict[int, int] = {}
        for s, t in live.items():
            for r in visited.get(s, ()):
                per[r] = per.get(r, 0) + t
        peak_replica = max(peak_replica, max(per.values(), default=0))
    return peak_all, peak_replica
