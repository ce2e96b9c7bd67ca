"""Whether a run's measurements can be read as the cache's effect.

- **Measurement error** (simulated runs): how far the client's TTFT strays from what
  the simulator modeled;
- **cold-turn asymmetry**: whether the arms differ where the cache cannot help.

The simulated replicas report each request's modeled TTFT (``server_ttft_s``, stored
times the time scale like every duration, so modeled seconds after loading). The client
measures TTFT itself (``ttft_s``). Their difference is the **measurement error**: the
client's own overhead, loopback, and the simulator's lateness against its deadline, all
multiplied by 1 / time scale. It is reported per arm and turn, in modeled seconds and
as a share of the cell's median TTFT; a cell whose median error exceeds
:data:`ERROR_SHARE` (2%) is flagged, because then differences between arms of that
size could be the clock, not the cache. The remedy is a larger time scale.

Real servers report no TTFT of their own (``server_ttft_s`` is null), and a run whose
target is not simulated never gets this table, whatever its records hold.

- **Late arrivals** (replays on the simulator's modeled clock): each request states its
  modeled arrival and is sent ahead of it; one that reaches the engine after the engine
  has passed that time joins the next step, later than the client modeled
  (``arrival_late_s``). Then the engine saw a different schedule than the one planned,
  and the run is no longer the deterministic replay it is meant to be. Per arm and turn
  the late requests are counted with the largest lateness; any is a limit of the run, and
  a cell whose largest lateness exceeds :data:`ERROR_SHARE` of its median TTFT is flagged
  (the share the measurement error may take before arms could differ by the clock, not the
  cache). The remedy is a larger time scale or a lower concurrency, so that the client
  keeps ahead of the engine.

- **Lag effect** (every run): a request is lag-flagged (``loop_lag_flag``) when the
  client's event loop stalled for more than 2% of its TTFT while it waited (the column's
  definition in :mod:`sessiongen.records.format`). A flag says a timestamp *could* have
  moved, not that a figure did: on the simulated pair flagged requests erred by a median
  1.0% and unflagged ones by up to 3.8%. So the evidence per cell is whether its median
  moves when each flagged request takes its session's unflagged TTFT from the cell's
  other blocks: a cell is ``moved`` when that shifts it by more than
  :data:`ERROR_SHARE`, and only moved cells are a problem.
"""

from __future__ import annotations

import dataclasses
import math

import polars as pl

from sessiongen.analysis.latency import speedup_table
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, MIN_SESSIONS, Bootstrap
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

#: A cell is flagged when its median measurement error exceeds this share of its median TTFT.
ERROR_SHARE = 0.02


def measurement_error(run: Run) -> pl.DataFrame:
    """Per arm and turn: median TTFT, the modeled median, the error's median and p90, its
    share of the median TTFT, and ``flagged`` (share above :data:`ERROR_SHARE`); empty
    for a target that is not simulated."""
    rows = run.ok.filter(pl.col("server_ttft_s").is_not_null(), pl.lit(run.simulated))
    error = pl.col("ttft_s") - pl.col("server_ttft_s")
    return (
        rows.group_by(list(CELL_KEYS))
        .agg(
            n=pl.len(),
            median_ttft_s=pl.col("ttft_s").median(),
            median_modeled_s=pl.col("server_ttft_s").median(),
            median_error_s=error.median(),
            p90_error_s=error.quantile(0.9, interpolation="higher"),
        )
        .with_columns(error_share=pl.col("median_error_s") / pl.col("median_ttft_s"))
        .with_columns(flagged=pl.col("error_share").abs() > ERROR_SHARE)
        .sort(list(CELL_KEYS))
    )


def late_arrivals(run: Run) -> pl.DataFrame:
    """Per arm and turn of a run whose requests stated modeled arrivals: requests, late
    ones (``arrival_late_s`` above zero), the largest lateness, the median TTFT, their
    ratio ``late_share`` and ``flagged`` (that share above :data:`ERROR_SHARE`); empty
    where no request stated an arrival (real targets, older runs)."""
    rows = run.ok.filter(pl.col("arrival_late_s").is_not_null())
    late = pl.col("arrival_late_s")
    return (
        rows.group_by(list(CELL_KEYS))
        .agg(
            n=pl.len(),
            late=(late > 0).sum(),
            max_late_s=late.max(),
            median_ttft_s=pl.col("ttft_s").median(),
        )
        .with_columns(late_share=(pl.col("max_late_s") / pl.col("median_ttft_s")).fill_nan(None))
        .with_columns(flagged=(pl.col("late_share") > ERROR_SHARE).fill_null(False))
        .sort(list(CELL_KEYS))
    )


def late_arrival_warning(run: Run, late: pl.DataFrame | None = None) -> str | None:
    """One line naming how many requests arrived late and by how much at most, with the
    remedy; None when none did. ``late`` is :func:`late_arrivals` where already computed."""
    cells = late_arrivals(run) if late is None else late
    count = int(cells["late"].sum()) if not cells.is_empty() else 0
    if not count:
        return None
    worst = cells.sort("max_late_s", descending=True).row(0, named=True)
    flagged = int(cells["flagged"].sum())
    text = (
        f"Late arrivals: {count} of {int(cells['n'].sum())} requests reached the simulator "
        f"after their modeled arrival (at most {worst['max_late_s']:.3g} {run.seconds} late, "
        f"{worst['placement']}/{worst['cache']} turn {worst['turn']}), so the engine saw a "
        "different schedule than the replay modeled"
    )
    if flagged:
        text += (
            f"; in {flagged} cells by more than {ERROR_SHARE:.0%} of their median TTFT, "
            "enough to move a comparison of arms"
        )
    remedy = time_scale_remedy(run)
    return f"{text}: {remedy} or lower the concurrency."


def lag_effect(run: Run) -> pl.DataFrame:
    """Per arm and turn: requests, lag-flagged ones (``unverifiable``: those without such
    a sibling, which no figure can be checked against), the median TTFT as measured and with
    each flagged request replaced by the same session's unflagged TTFT in the cell's other
    blocks (the same prompt and truth; kept as measured where there is none), the shift as
    a share, and ``moved`` (a stall only delays, so: the measured median above the other by
    more than :data:`ERROR_SHARE`). Leaving flagged requests out
    instead would leave other sessions in, and sessions differ by more than 2%."""
    flag = pl.col("loop_lag_flag").fill_null(False)
    unit = [*CELL_KEYS, "session_index"]
    rows = run.ok.with_columns(_flag=flag)
    reference = (
        rows.filter(~pl.col("_flag"), pl.col("session_index").is_not_null())
        .group_by(unit)
        .agg(_ref=pl.col("ttft_s").median())
    )
    joined = rows.join(reference, on=unit, how="left", nulls_equal=True)
    counterfactual = (
        pl.when(pl.col("_flag") & pl.col("_ref").is_not_null())
        .then(pl.col("_ref"))
        .otherwise(pl.col("ttft_s"))
    )
    return (
        joined.group_by(list(CELL_KEYS))
        .agg(
            n=pl.len(),
            lagged=pl.col("_flag").sum(),
            unverifiable=(pl.col("_flag") & pl.col("_ref").is_null()).sum(),
            median_ttft_s=pl.col("ttft_s").median(),
            median_unlagged_s=counterfactual.median(),
        )
        .with_columns(
            shift=(pl.col("median_ttft_s") / pl.col("median_unlagged_s") - 1).fill_nan(None)
        )
        .with_columns(moved=(pl.col("shift") > ERROR_SHARE).fill_null(False))
        .sort(list(CELL_KEYS))
    )


#: Cold first turns of the two arms may differ by this much before it is called out.
COLD_TOLERANCE = 0.05
#: ... except that the ON arm may be slower by up to this much: on a miss the pool
#: stores the prompt's KV, a cost of the cache itself, paid in CPU. Measured on the CPU
#: pair with one core per replica: ON/OFF cold TTFT 0.96-1.10 over four paired runs on a
#: quiet machine (+0.1 s of worker CPU per cold 8k prompt), and 1.26 beside a CPU hog
#: (the store's CPU work waits for a core too); 0.4 leaves room for noise above that.
#: The fault this check exists for, arms on different cores, made OFF 1.5-1.6x slower.
STORE_COST_TOLERANCE = 0.4


def common_prefix_blocks(run: Run) -> int:
    """The blocks a trace's first turns share with earlier requests, as most of them do:
    the median of ``trace_shared_blocks`` over first turns, rounded down (0 where half of
    them share nothing; a system prompt's blocks where most share it)."""
    shared = run.ok.filter(pl.col("turn") == 1)["trace_shared_blocks"].fill_null(0)
    median = shared.median() if shared.len() else None
    return int(median) if isinstance(median, int | float) else 0


def ran_alone(everything: pl.DataFrame, rows: pl.DataFrame) -> pl.Series:
    """For each of ``rows``: whether it waited for its first token with no other request
    of ``everything`` in flight on its replica in its block (no earlier request still
    running when it was sent, none sent before its first token). Measured from the
    records' send times, TTFTs and end-to-end times, so it holds for any arrivals."""
    keys = ["block", "replica"]
    start, first = pl.col("send_s"), pl.col("send_s") + pl.col("ttft_s").fill_null(0.0)
    end = pl.col("send_s") + pl.col("e2e_s").fill_null(pl.col("ttft_s")).fill_null(0.0)
    timed = everything.with_row_index("_row").filter(pl.col("send_s").is_not_null())
    ordered = timed.sort([*keys, "send_s"]).with_columns(
        _before=end.cum_max().shift(1).over(keys),
        _next=start.shift(-1).over(keys),
    )
    alone = ordered.select(
        "_row",
        (
            (pl.col("_before").fill_null(-math.inf) <= start)
            & (pl.col("_next").fill_null(math.inf) >= first)
        ).alias("_alone"),
    )
    marked = everything.with_row_index("_row").join(alone, on="_row", how="left")
    ids = rows.select(CELL_KEYS_ALONE).with_row_index("_pos")
    found = ids.join(
        marked.select(*CELL_KEYS_ALONE, "_alone"),
        on=list(CELL_KEYS_ALONE),
        how="left",
        nulls_equal=True,
    ).sort("_pos")
    return found["_alone"].fill_null(False)


#: What names one request across frames of the same run (for :func:`ran_alone`).
CELL_KEYS_ALONE = ("block", "session_id", "turn", "replica")


def cold_turn_asymmetry(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pl.DataFrame:
    """Cold first turns, OFF against ON, per placement and context size.

    Nothing is cached on a first turn in either arm, so the arms should take the same
    time there. The ratio median TTFT(OFF) / median TTFT(ON) of turn 1 comes with the
    speedup's interval (paired by session where the arms replay the same sessions); a
    pair of arms is ``flagged`` when the interval excludes 1 and the ON arm is more than
    :data:`COLD_TOLERANCE` faster, or more than :data:`STORE_COST_TOLERANCE` slower (the
    pool's own cost of storing on a miss). Then the arms differ beyond the cache (their
    processes, CPU contention, start-up work), and no speedup of the run can be read as
    the cache's alone. In a trace, first turns may share prefixes with earlier requests
    (and the pool may serve them under ON): those that share no more than the prefix
    most first turns share (:func:`common_prefix_blocks`: a system prompt) count as
    cold. Every replica holds that prefix after its first sight of it in either arm, so
    only those first sights differ, and they move the median of many first turns
    little; counting only first turns that share nothing (the old rule) left one first
    turn to compare on every trace with a system prompt.

    On a simulated target whose cold turns all carry the simulator's own TTFT
    (``server_ttft_s``, less its queue wait ``server_queue_s`` where recorded), the arms
    are compared on that: the simulator's engine is the
    same code in both arms, and what the client adds on a busy machine is measurement
    error, reported per cell (:func:`measurement_error`), not a difference between the
    arms. On the shipped chat trace at time scale 0.02 on 2 busy cores, the client's
    medians read ON 2.3x slower on cold turns where the simulator's were equal.

    Under open-loop arrivals (a trace's timestamps, Poisson, gamma) only first turns that
    ran alone on their replica are compared (:func:`ran_alone`): one sent into a queue
    waited as long as that arm's queue, which the pool shortens, so the difference
    would be the cache's own (a trace's OFF arm at 63 s against 2.6 s with the pool, its
    queue growing). Where none ran alone the arms are not compared (``queued``). A
    closed loop bounds each arm's queue by the same sessions in flight, and its cold
    turns are compared as they came.

    ``checked``: the pair of arms has at least :data:`~.stats.MIN_SESSIONS` units; only
    then is it compared. Below that the interval is too narrow to mean what it says (at
    2 sessions a nominal 95% interval held the truth about half the time,
    bench/interval_coverage.py): the real CPU pair's two-session smoke run once came out
    with OFF 5-20% slower on cold turns and an interval excluding 1 on a busy machine,
    with nothing wrong between the arms. Such a run is not called out either way; the
    report says the check did not run (:func:`cold_check_limit`).
    """
    cold = pl.col("turn") == 1
    if run.trace:
        cold = cold & (pl.col("trace_shared_blocks").fill_null(0) <= common_prefix_blocks(run))
    rows = run.filter(cold)
    ok = rows.ok
    server, waited = ok["server_ttft_s"], ok["server_queue_s"]
    if run.simulated and server.len() and server.null_count() == 0:
        modeled = pl.col("server_ttft_s")
        if waited.null_count() == 0:  # the engine's own service, its queue wait taken out
            modeled = modeled - pl.col("server_queue_s")
        modeled = pl.when(pl.col("ttft_s").is_not_null()).then(modeled)
        rows = dataclasses.replace(rows, requests=rows.requests.with_columns(ttft_s=modeled))
        queued = False
    elif run.trace or (run.meta.scenario.get("load") or {}).get("arrival", "closed") != "closed":
        lone = ran_alone(run.requests, rows.requests)  # open-loop: the records tell
        alone = dataclasses.replace(rows, requests=rows.requests.filter(lone))
        queued = alone.ok.is_empty() and not rows.ok.is_empty()
        rows = rows if queued else alone
    else:
        queued = False
    first = speedup_table(rows, boot=boot).drop("turn")
    ratio = pl.col("speedup")
    outside = (pl.col("speedup_ci_low") > 1.0) | (pl.col("speedup_ci_high") < 1.0)
    beyond = (ratio > 1.0 + COLD_TOLERANCE) | (ratio < 1.0 / (1.0 + STORE_COST_TOLERANCE))
    checked = (pl.col("n_units") >= MIN_SESSIONS) & pl.lit(not queued)
    return first.with_columns(checked=checked, queued=pl.lit(queued)).with_columns(
        flagged=(outside & beyond & checked).fill_null(False)
    )


def cold_check_limit(cold: pl.DataFrame) -> str | None:
    """The report's line for pairs of arms :func:`cold_turn_asymmetry` could not compare
    (``cold`` is its table); None when every pair was compared."""
    unchecked = cold.filter(~pl.col("checked"))
    if unchecked.is_empty():
        return None
    if "queued" in unchecked.columns and unchecked["queued"].any():
        return (
            f"Cold first turns not compared between the arms in {unchecked.height} of "
            f"{cold.height} placements: every one waited behind other requests (the load "
            "ran more than one session at a time), and the pool changes how long the "
            "queue is, so their times differ by the cache's own effect. Only requests "
            "that ran alone tell the arms' processes apart."
        )
    fewest = min(int(n) for n in unchecked["n_units"].to_list())
    return (
        f"Cold first turns not compared between the arms in {unchecked.height} of "
        f"{cold.height} placements (as few as {fewest} session{'' if fewest == 1 else 's'}; "
        f"{MIN_SESSIONS} needed): "
        "a difference between the arms beyond the cache (their processes, CPU "
        "contention) would go unseen here."
    )


def trust_warnings(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> list[str]:
    """One line per reason the run's speedups cannot be read as the cache's effect."""
    out = []
    cold = cold_turn_asymmetry(run, boot=boot).filter(pl.col("flagged"))
    for row in cold.iter_rows(named=True):
        out.append(
            f"warning: arms differ beyond the cache: cold first turns ({row['placement']}, "
            f"context {row['context_tokens']}) OFF/ON {row['speedup']:.2f}x "
            f"[{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]; no speedup of "
            "this run can be read as the cache's alone"
        )
    errors = measurement_error(run).filter(pl.col("flagged"))
    if not errors.is_empty():
        worst = float(errors.select(pl.col("error_share").abs().max()).item())
        out.append(
            f"warning: measurement error above {ERROR_SHARE:.0%} of the median TTFT in "
            f"{errors.height} cells (worst {worst:.1%}); {time_scale_remedy(run)}"
        )
    late = late_arrival_warning(run)
    if late is not None:
        out.append(f"warning: {late[0].lower()}{late[1:]}")
    return out


def time_scale_remedy(run: Run) -> str:
    """How to make a simulated run's measurement error smaller: a larger time scale,
    where the run's target sets it."""
    if run.meta.target_kind == "sim":
        return "raise target.sim.time_scale"
    return "serve the simulated replicas at a larger --time-scale"
