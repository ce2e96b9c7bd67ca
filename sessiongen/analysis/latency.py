"""Latency analysis of a run: per-turn medians, ON/OFF speedups and whole sessions.

The CLI, the notebook and the nightly job reach these through :mod:`sessiongen.analysis`.

Definitions (docs/concepts/statistics.md links here)
-----------------------------------
- **Modeled seconds.** Every duration is in modeled seconds, ``measured /
  manifest["target"]["time_scale"]`` (converted at load, see :mod:`sessiongen.records.run`).
- **Rows used.** Warm-up rows are dropped; rows whose ``status`` is not ``"ok"`` are
  counted as ``errors`` per arm and turn and left out of every latency statistic.
- **Arm** = placement policy x cache (``off``/``on``). Frames always carry
  ``context_tokens`` as a grouping key (one value for most runs; displays drop it then).
- **Speedup** = median TTFT(OFF) / median TTFT(ON) per placement, context size and turn.
  Its interval is a seeded percentile bootstrap (:mod:`sessiongen.analysis.stats`). When both arms
  of a placement replay the same sessions (the OFF, ON, ON, OFF design does), sessions
  are resampled as units, with all their blocks, in both arms at once (paired); otherwise
  each arm's sessions are resampled on their own (unpaired). The ``paired`` column says
  which; ``n_units`` counts the sessions. Intervals are expanded for small session
  counts (Hesterberg 2015); below :data:`~sessiongen.analysis.stats.MIN_SESSIONS` they
  still cover less than stated (:func:`sessiongen.analysis.adequacy.interval_warnings`).
- **Standard errors** ``ttft_log_se`` and ``speedup_log_se``: the bootstrap standard
  error of the log median (or log speedup) over the same resamples, corrected for the
  session count (:func:`sessiongen.analysis.stats.log_se`); the trend store keeps them,
  so that a night's weight never depends on how wide or expanded its interval was.
- **Per-arm intervals** (median and p90 TTFT) resample sessions as units, each with all
  its blocks (a cluster bootstrap): the requests of one session are not independent, and
  resampling them as if they were gave intervals that missed the variation between
  sessions (and, in the trend, made nights look more precise than they are). Rows
  without a session fall back to resampling requests. ``sessions`` counts the units.
- **Session gain** (:data:`SESSION_GAIN`, :func:`session_speedup`): the pool's gain in
  what the user waits for, the whole session. One definition for every figure of that
  name: the report's whole-session table, the load section, routing's headline and the
  planner's what-if table (:mod:`sessiongen.capacity.plan` calls the same function).
- **Block drift**: see :mod:`sessiongen.analysis.drift`.
- **Contamination, attribution, correctness**: see :mod:`sessiongen.analysis.checks`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from sessiongen.analysis import stats, timeblocks
from sessiongen.analysis.checks import contamination_expr
from sessiongen.analysis.frames import (
    clusters,
    finite_or_none,
    frame_from_rows,
    partition,
    unit_matrix,
)
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.records.format import ARM_KEYS, CELL_KEYS
from sessiongen.records.run import Run


def arm_turn_table(
    run: Run, *, extra_keys: Sequence[str] = (), boot: Bootstrap = DEFAULT_BOOTSTRAP
) -> pl.DataFrame:
    """Per arm, context size (and ``extra_keys``) and turn: counts, TTFT median and p90 with CIs."""
    keys = [*ARM_KEYS, "context_tokens", *extra_keys, "turn"]
    counts = (
        run.requests.with_columns(contamination_expr(run).alias("_contaminated"))
        .group_by(keys)
        .agg(
            n=((pl.col("status") == "ok") & pl.col("ttft_s").is_not_null()).sum(),
            errors=(pl.col("status") != "ok").sum(),
            contamination=pl.col("_contaminated").sum(),
        )
    )
    rows = []
    for key, sub in partition(run.ok, keys):
        units = clusters(sub)
        opts = boot.options(stats.stable_seed(boot.seed, "arm", *key.values()))
        med = stats.bootstrap_quantile(units, 0.5, **opts)
        p90 = stats.bootstrap_quantile(units, 0.9, **opts)
        rows.append(
            {
                **key,
                "sessions": med.n if units.ndim == 2 else None,
                "median_ttft_s": med.estimate,
                "ci_low_s": med.low,
                "ci_high_s": med.high,
                "ttft_log_se": med.log_se,
                "p90_ttft_s": p90.estimate,
                "p90_ci_low_s": p90.low,
                "p90_ci_high_s": p90.high,
                "median_ttfb_s": sub["ttfb_s"].median(),
                "median_e2e_s": sub["e2e_s"].median(),
                "median_queue_s": sub["queue_s"].median(),
            }
        )
    names = [
        "median_ttft_s",
        "ci_low_s",
        "ci_high_s",
        "ttft_log_se",
        "p90_ttft_s",
        "p90_ci_low_s",
        "p90_ci_high_s",
        "median_ttfb_s",
        "median_e2e_s",
        "median_queue_s",
    ]
    types: dict[str, pl.DataType] = {"sessions": pl.Int64()}
    types.update({n: pl.Float64() for n in names})
    values = frame_from_rows(rows, keys, run.requests, types)
    return counts.join(values, on=keys, how="left", nulls_equal=True).sort(keys)


def paired_design(run: Run) -> set[tuple[str, int]]:
    """(placement, context_tokens) whose OFF and ON arms hold the same sessions."""
    sessions = (
        run.requests.filter(pl.col("session_index").is_not_null())
        .group_by("placement", "context_tokens", "cache")
        .agg(pl.col("session_index").unique().sort())
    )
    by_arm = {
        (r["placement"], r["context_tokens"], r["cache"]): r["session_index"]
        for r in sessions.iter_rows(named=True)
    }
    nulls = run.requests.filter(pl.col("session_index").is_null())
    unpairable = set(
        zip(nulls["placement"].to_list(), nulls["context_tokens"].to_list(), strict=True)
    )
    return {
        (p, c)
        for (p, c, cache), units in by_arm.items()
        if cache == "off"
        and units
        and by_arm.get((p, c, "on")) == units
        and (p, c) not in unpairable
    }


def _ratio(
    off: pl.DataFrame,
    on: pl.DataFrame,
    paired: bool,
    boot: Bootstrap,
    seed: list[int],
    column: str = "ttft_s",
) -> tuple[stats.Interval, int]:
    """Median(off) / median(on) with its interval, and the number of resampled units."""
    if off.height == 0 or on.height == 0:  # one arm (a plan or run of one): no ratio, as
        return stats.Interval(math.nan, math.nan, math.nan, 0), 0  # bootstrap_ratio says
    opts = boot.options(seed)
    if paired:
        units = sorted(set(off["session_index"].to_list()) | set(on["session_index"].to_list()))
        a, b = unit_matrix(off, units, column), unit_matrix(on, units, column)
        ci = stats.bootstrap_ratio(a, b, paired=True, **opts)
    else:
        ci = stats.bootstrap_ratio(clusters(off, column), clusters(on, column), **opts)
    return ci, ci.n


SPEEDUP_VALUES: dict[str, pl.DataType] = {
    "n_off": pl.Int64(),
    "n_on": pl.Int64(),
    "median_off_s": pl.Float64(),
    "median_on_s": pl.Float64(),
    "speedup": pl.Float64(),
    "speedup_ci_low": pl.Float64(),
    "speedup_ci_high": pl.Float64(),
    "speedup_log_se": pl.Float64(),
    "paired": pl.Boolean(),
    "n_units": pl.Int64(),
}


def _speedup_rows(
    frame: pl.DataFrame,
    keys: list[str],
    pairable: set[tuple[str, int]],
    boot: Bootstrap,
    tag: str,
    column: str,
) -> list[dict[str, object]]:
    """Per group of ``keys``: median ``column`` OFF and ON and their ratio with a CI."""
    rows: list[dict[str, object]] = []
    for key, sub in partition(frame, keys):
        off = sub.filter(pl.col("cache") == "off")
        on = sub.filter(pl.col("cache") == "on")
        paired = (key["placement"], key["context_tokens"]) in pairable
        seed = stats.stable_seed(boot.seed, tag, *key.values())
        ci, units = _ratio(off, on, paired, boot, seed, column=column)
        rows.append(
            {
                **key,
                "n_off": off.height,
                "n_on": on.height,
                "median_off_s": off[column].median(),
                "median_on_s": on[column].median(),
                "speedup": finite_or_none(ci.estimate),
                "speedup_ci_low": finite_or_none(ci.low),
                "speedup_ci_high": finite_or_none(ci.high),
                "speedup_log_se": finite_or_none(ci.log_se),
                "paired": paired,
                "n_units": units,
            }
        )
    return rows


def speedup_table(
    run: Run, *, extra_keys: Sequence[str] = (), boot: Bootstrap = DEFAULT_BOOTSTRAP
) -> pl.DataFrame:
    """Per placement, context size (and ``extra_keys``) and turn: ON/OFF speedup with a CI."""
    keys = ["placement", "context_tokens", *extra_keys, "turn"]
    rows = _speedup_rows(run.ok, keys, paired_design(run), boot, "speedup", "ttft_s")
    return frame_from_rows(rows, keys, run.requests, SPEEDUP_VALUES).sort(keys)


def cross_vs_same(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pl.DataFrame:
    """Speedups of turns >= 2, split by whether the previous turn ran on another replica."""
    later = run.filter(pl.col("turn") > 1, pl.col("cross_replica").is_not_null())
    return speedup_table(later, extra_keys=("cross_replica",), boot=boot)


def cold_first_turns(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pl.DataFrame:
    """Turn 1 (cold) per arm: TTFT with CIs, the largest cached-token count, contamination."""
    first = run.filter(pl.col("turn") == 1)
    table = arm_turn_table(first, boot=boot).drop("turn")
    cached = first.requests.group_by(*ARM_KEYS, "context_tokens").agg(
        max_cached_tokens=pl.col("cached_tokens").max()
    )
    return table.join(cached, on=[*ARM_KEYS, "context_tokens"], how="left", nulls_equal=True)


#: What "session gain" means, wherever a figure of that name is shown (written once).
SESSION_GAIN = (
    "median over complete sessions of the whole-session end-to-end time (the sum of its "
    "turns' e2e: what the user waits for), OFF / ON"
)


def session_totals(run: Run, *, extra_keys: Sequence[str] = ()) -> pl.DataFrame:
    """Per session and block: turns done, whether all turns succeeded, total TTFT and time."""
    keys = [*ARM_KEYS, "context_tokens", *extra_keys, "block", "session_index", "session_id"]
    totals = run.requests.group_by(keys).agg(
        turns_ok=(pl.col("status") == "ok").sum(),
        sent=pl.len(),
        total_ttft_s=pl.col("ttft_s").sum(),
        total_e2e_s=pl.col("e2e_s").sum(),
        total_queue_s=pl.col("queue_s").sum(),
    )
    if run.trace or run.meta.dataset:
        # A trace's or a dataset's sessions have their own lengths: complete when every
        # turn sent was ok and as many were sent as in the block that sent the most of
        # that session (a failed turn stops its session, and is itself recorded).
        most = pl.col("sent").max().over("session_id")
        complete = (pl.col("turns_ok") == pl.col("sent")) & (pl.col("sent") == most)
    else:
        complete = pl.col("turns_ok") == run.turns
    return totals.with_columns(complete=complete).drop("sent").sort(keys)


def session_speedup(
    run: Run,
    *,
    extra_keys: Sequence[str] = (),
    column: str = "total_e2e_s",
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
) -> pl.DataFrame:
    """Per placement, context (and ``extra_keys``): the session gain (:data:`SESSION_GAIN`).

    ``column`` names another total of :func:`session_totals` to take the same ratio of
    (``total_ttft_s``: the planner's TTFT-sum gain); the default is the session gain.
    """
    totals = session_totals(run, extra_keys=extra_keys).filter(pl.col("complete"))
    keys = ["placement", "context_tokens", *extra_keys]
    pairable = paired_design(run)
    if run.trace:
        totals = in_time_blocks(totals, keys, pairable, column)
    rows = _speedup_rows(totals, keys, pairable, boot, "session", column)
    out = frame_from_rows(rows, keys, totals, SPEEDUP_VALUES)
    unit = "time block" if run.trace else "session"
    return out.with_columns(pl.lit(unit).alias("unit"))


def in_time_blocks(
    totals: pl.DataFrame, keys: Sequence[str], pairable: set[tuple[str, int]], column: str
) -> pl.DataFrame:
    """A trace's session totals with ``session_index`` replaced by its block of time
    (:mod:`sessiongen.analysis.timeblocks`), per group of ``keys``: the block length
    from the autocorrelation of the sessions' log OFF / ON ``column``, in the order of
    their index (a trace's sessions are numbered by their first request; replicates'
    indices are apart). ``block_sessions`` holds the length. Unpaired groups keep their
    sessions."""
    parts = []
    for key, sub in partition(totals, keys):
        if (key["placement"], key["context_tokens"]) not in pairable:
            parts.append(sub.with_columns(pl.lit(1).alias("block_sessions")))
            continue
        per = sub.group_by("session_index", "cache").agg(pl.col(column).sum())
        wide = per.pivot(on="cache", index="session_index", values=column).sort("session_index")
        index = wide["session_index"].to_numpy()
        if {"off", "on"} <= set(wide.columns):
            series = np.log(wide["off"].to_numpy() / wide["on"].to_numpy())
        else:
            series = np.zeros(index.size)
        length = timeblocks.block_length(series)
        ids = timeblocks.block_ids(np.arange(index.size), length)
        lookup = pl.DataFrame({"session_index": index, "_unit": ids.astype(np.int32)})
        parts.append(
            sub.join(lookup, on="session_index", how="left")
            .with_columns(
                pl.col("_unit").alias("session_index"), pl.lit(length).alias("block_sessions")
            )
            .drop("_unit")
        )
    return pl.concat(parts, how="diagonal_relaxed") if parts else totals


def _fmt_cell(value: float | None, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


def console_table(run: Run) -> str:
    """Median TTFT per turn per arm and the ON/OFF speedup, as plain text (no bootstrap).

    A run of one arm (given endpoints of one ``--cache``) has that arm's column per
    placement and no speedup column: there is no ratio to show until the other arm's run
    is merged with it."""
    med = run.ok.group_by(list(CELL_KEYS)).agg(pl.col("ttft_s").median())
    lookup = {tuple(r[k] for k in CELL_KEYS): r["ttft_s"] for r in med.iter_rows(named=True)}
    placements = sorted(run.requests["placement"].unique().to_list())
    contexts = sorted(run.requests["context_tokens"].unique().to_list())
    turns = sorted(run.requests["turn"].unique().to_list())
    arms = sorted(run.requests["cache"].unique().to_list())
    lines = [f"Median TTFT per turn, {run.seconds} (target: {run.target_label})"]
    if len(arms) == 1:
        lines.append(
            f"cache {arms[0]} only: no speedup until the other arm's run is merged with this "
            "one (sessiongen report RUN_OFF RUN_ON)"
        )
    for ctx in contexts:
        if len(contexts) > 1:
            lines.append(f"context {ctx} tokens")
        header = ["turn"]
        for p in placements:
            header += [f"{p} {arm}" for arm in arms] + (["speedup"] if len(arms) > 1 else [])
        table = [header]
        for turn in turns:
            row = [str(turn)]
            for p in placements:
                off, on = lookup.get((p, "off", ctx, turn)), lookup.get((p, "on", ctx, turn))
                row += [_fmt_cell(lookup.get((p, arm, ctx, turn)), ".3f") for arm in arms]
                if len(arms) > 1:
                    speed = off / on if off is not None and on else None
                    row.append("-" if speed is None else f"{speed:.2f}x")
            table.append(row)
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join(lines)
