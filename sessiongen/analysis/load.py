"""A run under load: saturation, goodput, the load each arm sustains, working set, reuse.

Definitions (all durations in modeled seconds; a *level* is a block's load level: the
concurrency of a closed loop or the session start rate of an open loop):

- **Offered load**: the level. **Throughput**: completed turns per modeled second over
  the span of each block (first send to last end), summed over an arm's blocks of the
  level and divided by their spans' sum.
- **Tails**: p50 with its sample count; p90 as MLPerf LoadGen's early-stopping
  estimate on the *effective* sample size, sessions as clusters
  (:func:`sessiongen.analysis.tails.clustered_tail`), or "n/a" with how many are needed.
- **Goodput** against the scenario's ``[objective]``: the share of turns whose TTFT is
  at most ``ttft_s`` (``good_turns``) with a 95% interval over **sessions as units**
  (Wilson's on the effective sample size, :func:`sessiongen.analysis.hypotheses.clustered_share`:
  the turns of a session share prompts, a replica and queueing episodes, so they are
  not independent), and the share of whole sessions all of whose turns are
  (``good_sessions``). An arm **meets** the objective at a level when
  ``good_turns >= attainment``.
- **Sustained load** of an arm, levels in increasing order: ``sustains`` is the last
  level of the leading run of levels that meet the objective; ``sure`` the last level of
  the leading run whose interval lies wholly at or above the attainment; ``fails`` the
  first level from which every higher level's interval lies wholly below it. The truth
  is between ``sure`` and ``fails``. A sweep where a level meets the objective after one
  that missed it is **not monotone** (``monotone`` false): its levels disagree more
  than their intervals allow, or the system really recovers under more load, and the
  report says so rather than reading a capacity off it.
- **Stability** (scheduled arrivals: open loop, traces): ``ttft_growth`` is how fast
  TTFT grows with the sessions' scheduled starts (``arrival_s``), seconds of TTFT per
  second of arrivals: the difference between the median TTFT of the turns of the
  last and the first third of sessions to start, over the difference of those thirds'
  median starts. An arm that serves what is offered keeps it near zero (or below, as
  caches warm); offered work ``rho`` times what the arm serves builds a backlog that a
  session starting at ``a`` waits behind for about ``(rho - 1) a``. Above
  :data:`MAX_GROWTH` (offered load more than about 5% above capacity) the arm is
  **unstable** at that level (``stable`` false): its medians and tails grow with the
  run's length and describe the run, not the system, so the report says so rather
  than printing them as the arm's latency. Batching can spread an overload over every
  request alike instead of queueing it, so an open loop of synthetic sessions is also
  unstable where its throughput is below half the offered turn rate
  (``offered_turns_s``: the level times the turns per session), far below what a
  finite run's ramp and tail take off it. A closed loop (no scheduled starts) holds
  at most its level in flight and is always stable (``ttft_growth`` null).
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

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis import hypotheses
from sessiongen.analysis.frames import partition
from sessiongen.analysis.tails import clustered_tail
from sessiongen.records.run import Run

#: The keys of one arm at one level.
LEVEL_KEYS = ("placement", "cache", "context_tokens", "load_level")
#: TTFT growth (seconds per second of the run) above which an arm is unstable at a level.
MAX_GROWTH = 0.05
#: Turns an arm needs at a level before its growth is estimated (three per third).
MIN_GROWTH_TURNS = 9
#: Throughput below this share of the offered turn rate marks an open loop unstable.
MIN_SERVED_SHARE = 0.5


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


def ttft_growth(ok: pl.DataFrame) -> float | None:
    """TTFT growth with the scheduled starts of one arm's turns (see the module doc), or
    None without starts, with fewer than :data:`MIN_GROWTH_TURNS` or no time between
    the thirds."""
    timed = ok.filter(pl.col("arrival_s").is_not_null())
    if timed.height < MIN_GROWTH_TURNS:
        return None
    timed = timed.select(t=pl.col("arrival_s"), ttft=pl.col("ttft_s")).sort("t")
    third = timed.height // 3
    first, last = timed.head(third), timed.tail(third)
    span = _median(last["t"]) - _median(first["t"])
    if span <= 0:
        return None
    return (_median(last["ttft"]) - _median(first["ttft"])) / span


def _median(values: pl.Series) -> float:
    m = values.median()
    return float(m) if isinstance(m, int | float) else 0.0


def load_table(run: Run, ttft_s: float | None, attainment: float = 0.9) -> pl.DataFrame:
    """Per arm and level: samples, p50 and p90 (early stopping), throughput, goodput,
    whether it is stable (its TTFT does not grow over the run)."""
    rows: list[dict[str, object]] = []
    turns = _open_loop_turns(run)
    for key, sub in partition(_with_level(run), LEVEL_KEYS):
        ok = sub.filter((pl.col("status") == "ok") & pl.col("ttft_s").is_not_null())
        ttft = ok["ttft_s"].to_numpy().astype(np.float64)
        p90 = clustered_tail(ttft, ok["session_id"].fill_null("").to_numpy(), 0.9)
        growth = ttft_growth(ok)
        served = _throughput(sub)
        offered = None if turns is None else float(sub["load_level"][0]) * turns
        short = offered is not None and served is not None and served < MIN_SERVED_SHARE * offered
        rows.append(
            {
                **key,
                "turns": sub.height,
                "errors": int((sub["status"] != "ok").sum()),
                "p50_ttft_s": float(np.median(ttft)) if ttft.size else None,
                "p90_ttft_s": p90.bound,
                "p90_note": p90.text(),
                "p90_effective_n": p90.n_effective,
                "median_queue_s": ok["queue_s"].median(),
                "throughput_turns_s": served,
                "ttft_growth": growth,
                "offered_turns_s": offered,
                "stable": (growth is None or growth <= MAX_GROWTH) and not short,
                **_goodput(sub, ttft_s, attainment),
            }
        )
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
    "good_units": pl.Int64(),
    "meets": pl.Boolean(),
    "p90_effective_n": pl.Float64(),
    "ttft_growth": pl.Float64(),
    "offered_turns_s": pl.Float64(),
    "stable": pl.Boolean(),
}
#: Goodput columns (all null without an objective).
GOODPUT_COLUMNS = (
    "good_turns",
    "good_turns_low",
    "good_turns_high",
    "good_sessions",
    "good_units",
    "meets",
)


def _open_loop_turns(run: Run) -> int | None:
    """Turns per session of an open loop of synthetic sessions (None: closed, trace)."""
    sc = run.meta.scenario
    arrival = (sc.get("load") or {}).get("arrival", "closed")
    sessions = sc.get("sessions") or {}
    turns = sessions.get("turns")
    if arrival == "closed" or sessions.get("source", "synthetic") == "trace":
        return None
    return turns if isinstance(turns, int) and turns > 0 else None


def _goodput(sub: pl.DataFrame, ttft_s: float | None, attainment: float) -> dict[str, float | None]:
    """Good turns and sessions against the objective (a failed turn is never good).

    The interval of ``good_turns`` takes sessions as units (``good_units`` of them): a
    session is the same ``session_id`` in every block of the arm and level.
    """
    if ttft_s is None:
        return dict.fromkeys(GOODPUT_COLUMNS)
    good = (pl.col("status") == "ok") & (pl.col("ttft_s") <= ttft_s)
    flagged = sub.with_columns(good=good.fill_null(False))
    if flagged.is_empty():
        return dict.fromkeys(GOODPUT_COLUMNS)
    units = flagged.group_by("session_id").agg(y=pl.col("good").sum(), m=pl.len())
    share = hypotheses.clustered_share(units["y"].to_numpy(), units["m"].to_numpy())
    per_session = flagged.group_by("block", "session_id").agg(all_good=pl.col("good").all())
    return {
        "good_turns": share.share,
        "good_turns_low": share.low,
        "good_turns_high": share.high,
        "good_sessions": float(per_session.select(pl.col("all_good").mean()).item()),
        "good_units": share.n_units,
        "meets": share.share >= attainment,
    }


def _leading(flags: list[bool], levels: list[float]) -> float | None:
    """The last level of the leading run of True flags (None when the first is False)."""
    last = None
    for level, flag in zip(levels, flags, strict=True):
        if not flag:
            break
        last = level
    return last


def _fails_from(flags: list[bool], levels: list[float]) -> float | None:
    """The first level from which every flag is True (None when the last is False)."""
    first = None
    for level, flag in zip(reversed(levels), reversed(flags), strict=True):
        if not flag:
            break
        first = level
    return first


def sustained_load(table: pl.DataFrame, attainment: float = 0.9) -> pl.DataFrame:
    """Per arm: the load it sustains within the objective, where that is sure, where it
    surely fails, and whether the sweep is monotone (see the module docstring)."""
    rows = []
    arm = ["placement", "cache", "context_tokens"]
    for key, sub in partition(table.filter(pl.col("meets").is_not_null()), arm):
        sub = sub.sort("load_level")
        levels = [float(v) for v in sub["load_level"].to_list()]
        meets = [bool(v) for v in sub["meets"].to_list()]
        sure = [lo >= attainment for lo in sub["good_turns_low"].fill_nan(0.0).to_list()]
        fail = [hi < attainment for hi in sub["good_turns_high"].fill_nan(1.0).to_list()]
        first_miss = meets.index(False) if False in meets else len(meets)
        rows.append(
            {
                **key,
                "sustains": _leading(meets, levels),
                "sure": _leading(sure, levels),
                "fails": _fails_from(fail, levels),
                "levels": len(levels),
                "monotone": not any(meets[first_miss:]),
            }
        )
    schema = {
        "sustains": pl.Float64(),
        "sure": pl.Float64(),
        "fails": pl.Float64(),
        "monotone": pl.Boolean(),
    }
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


#: The columns of :func:`in_flight_table`, per cache arm (quantiles over time).
IN_FLIGHT_COLUMNS = ("in_flight_p50", "in_flight_p90", "before_first_token_p50")


#: A float array.
Floats = NDArray[np.float64]


def in_flight_table(run: Run, *, wide: bool = False) -> pl.DataFrame:
    """Requests in flight as measured, per arm and level (:data:`LEVEL_KEYS`), over the
    modeled time of each arm's blocks (first send to last end, every block's time pooled):
    ``in_flight_p50``/``in_flight_p90`` the median and 90th percentile over time of the
    requests sent and not yet ended (``send_s`` to ``send_s + e2e_s``; a request without
    an end counts to its first token); ``before_first_token_p50`` the median of those
    still before their first token (queued or in prefill). Time-weighted, not
    per-request: what an open loop of trace timestamps actually held, where its
    ``load_level`` says nothing. Requests that never got a first token nor an end do not
    count. ``wide``: one row per (placement, context_tokens, load_level), the columns
    suffixed ``_off`` / ``_on`` as the what-if table has them. Replicates pooled into
    one run must number their blocks apart, or their overlapping clocks add up."""
    rows = (
        _with_level(run)
        .with_columns(
            _end=pl.col("send_s") + pl.coalesce("e2e_s", "ttft_s"),
            _first=pl.col("send_s") + pl.coalesce("ttft_s", "e2e_s"),
        )
        .filter(pl.col("send_s").is_not_null() & pl.col("_end").is_not_null())
    )
    out: list[dict[str, object]] = []
    for key, sub in partition(rows, list(LEVEL_KEYS)):
        flight: list[Floats] = []
        waiting: list[Floats] = []
        for _, block in partition(sub, ["block"]):
            send = block["send_s"].to_numpy().astype(float)
            end = block["_end"].to_numpy().astype(float)
            flight.append(_intervals(send, end, until=float(end.max())))
            first = block["_first"].to_numpy().astype(float)
            waiting.append(_intervals(send, first, until=float(end.max())))
        p50, p90 = _pooled_quantiles(flight, (0.5, 0.9))
        (first50,) = _pooled_quantiles(waiting, (0.5,))
        out.append(
            {**key, "in_flight_p50": p50, "in_flight_p90": p90, "before_first_token_p50": first50}
        )
    schema = {
        "placement": pl.String(), "cache": pl.String(), "context_tokens": pl.Int64(),
        "load_level": pl.Float64(), **{c: pl.Float64() for c in IN_FLIGHT_COLUMNS},
    }  # fmt: skip
    table = pl.DataFrame(out, schema=schema).select(
        "placement", "context_tokens", "load_level", "cache", *IN_FLIGHT_COLUMNS
    )
    if not wide:
        return table.sort("placement", "context_tokens", "load_level", "cache")
    keys = ["placement", "context_tokens", "load_level"]
    result = table.select(keys).unique()
    for cache in ("off", "on"):
        arm = table.filter(pl.col("cache") == cache).select(
            *keys, *(pl.col(c).alias(f"{c}_{cache}") for c in IN_FLIGHT_COLUMNS)
        )
        result = result.join(arm, on=keys, how="left", nulls_equal=True)
    return result.sort(keys)


def _intervals(starts: Floats, ends: Floats, *, until: float) -> Floats:
    """One block's (counts, durations) of open ``[start, end)`` intervals from its first
    start to ``until`` (the block's last end), as rows of a 2 x n array."""
    times = np.concatenate([starts, ends, [until]])
    steps = np.concatenate([np.ones(len(starts)), -np.ones(len(ends)), [0.0]])
    order = np.lexsort((steps, times))  # by time, ends (-1) before starts (+1) at a tie
    times, counts = times[order], np.cumsum(steps[order])
    return np.vstack([counts[:-1], np.diff(times)])


def _pooled_quantiles(blocks: list[Floats], qs: tuple[float, ...]) -> list[float | None]:
    """Time-weighted quantiles of the counts over every block's time."""
    both = np.hstack(blocks) if blocks else np.zeros((2, 0))
    levels, held = both[0], both[1]
    total = float(held.sum())
    if total <= 0:
        return [None] * len(qs)
    by = np.argsort(levels, kind="stable")
    cum = np.cumsum(held[by]) / total
    return [float(levels[by][min(int(np.searchsorted(cum, q)), len(cum) - 1)]) for q in qs]
