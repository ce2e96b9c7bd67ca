"""A run's records reduced to the pool decision: the what-if rows and their verdicts.

One reduction for both kinds of run, so a plan and a replay name and mean the same
figures (:data:`~sessiongen.capacity.grid.WHATIF_COLUMNS`): per arm (placement,
context, load level) the **session gain** (whole-session end-to-end time OFF / ON,
:func:`sessiongen.analysis.latency.session_speedup`), the **later-turn gain** (median TTFT
over turns 2.. OFF / ON, every later turn pooled; the paired session bootstrap of the
per-turn speedup), the **median per-turn gain (turns 2..)** (``later_turn_gain``: the
median over turns 2.. of each turn's own OFF / ON ratio), goodput, hit rates, queueing;
then :func:`measured_decision` adds the arms' stability and the verdict at ``pays_at``
(:func:`.decision.with_verdicts`), as ``sessiongen plan`` does for a configuration.

It imports neither the planner nor the report, so the replay report
(:mod:`sessiongen.report.decision`) reads its decision from here without an import
cycle (:mod:`.plan` imports the report stage to write its own); the planner and
:mod:`.heldout` import them from here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import polars as pl

from sessiongen.analysis.latency import session_speedup, speedup_table
from sessiongen.analysis.stats import clustered_share
from sessiongen.capacity.decision import arm_stability, with_verdicts
from sessiongen.records.run import Run

#: The keys of an arm in a plan's tables.
ARM = ["placement", "context_tokens", "load_level"]

#: The goodput interval's columns, per cache arm.
GOODPUT_BOUNDS = tuple(f"good_turns_{c}_{end}" for c in ("off", "on") for end in ("low", "high"))


def _measured(run: Run) -> pl.DataFrame:
    return run.ok.with_columns(pl.col("load_level").fill_null(1.0))


def turn_table(run: Run) -> pl.DataFrame:
    """Per arm and turn: median and p90 TTFT per cache arm and the pool's gain."""
    ok = _measured(run)
    per = ok.group_by([*ARM, "cache", "turn"]).agg(
        pl.col("ttft_s").median().alias("ttft_p50_s"),
        pl.col("ttft_s").quantile(0.9, "nearest").alias("ttft_p90_s"),
        pl.len().alias("n"),
    )
    wide = per.pivot(on="cache", index=[*ARM, "turn"], values=["ttft_p50_s", "ttft_p90_s", "n"])
    for col in ("ttft_p50_s_off", "ttft_p50_s_on"):
        if col not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    # the pivot's columns follow the order the groups came in, which varies run to run
    arms = [f"{v}_{c}" for v in ("ttft_p50_s", "ttft_p90_s", "n") for c in ("off", "on")]
    return wide.select(
        *ARM,
        "turn",
        *(c for c in arms if c in wide.columns),
        (pl.col("ttft_p50_s_off") / pl.col("ttft_p50_s_on")).alias("pool_gain"),
    ).sort([*ARM, "turn"])


def _session_gain(run: Run, column: str, name: str) -> pl.DataFrame:
    """Per arm: the replay's session gain (or its TTFT-sum twin), the same function."""
    gains = session_speedup(run, extra_keys=("load_level",), column=column)
    return gains.select(
        "placement",
        "context_tokens",
        pl.col("load_level").fill_null(1.0),
        pl.col("speedup").alias(name),
        pl.col("speedup_ci_low").alias(f"{name}_low"),
        pl.col("speedup_ci_high").alias(f"{name}_high"),
        pl.col("n_units").alias(f"{name}_units"),
        pl.col("unit").alias(f"{name}_unit"),
    )


def _later_gain(run: Run) -> pl.DataFrame:
    """Per arm: median TTFT over turns 2.. OFF / ON, sessions the units (the same paired
    bootstrap as the per-turn speedup, every later turn of a session one unit's values)."""
    later = run.filter(pl.col("turn") >= 2)
    later = replace(
        later,
        requests=later.requests.with_columns(
            pl.lit(2).alias("turn"), pl.col("load_level").fill_null(1.0)
        ),
    )
    gains = speedup_table(later, extra_keys=("load_level",))
    return gains.select(
        *ARM,
        pl.col("speedup").alias("later_gain"),
        pl.col("speedup_ci_low").alias("later_gain_low"),
        pl.col("speedup_ci_high").alias("later_gain_high"),
    )


def _goodput(ok: pl.DataFrame, target: float) -> pl.DataFrame:
    """Per arm and cache arm: the share of turns within the objective's 95% interval,
    sessions the clusters (:func:`~sessiongen.analysis.stats.clustered_share`), wide
    (``good_turns_off_low`` .. ``good_turns_on_high``)."""
    per = ok.group_by([*ARM, "cache", "session_index"]).agg(
        (pl.col("ttft_s") <= target).sum().alias("good"), pl.len().alias("turns")
    )
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, sub in per.group_by([*ARM, "cache"]):
        share = clustered_share(sub["good"].to_numpy(), sub["turns"].to_numpy())
        row = rows.setdefault(key[:-1], dict(zip(ARM, key[:-1], strict=True)))
        row[f"good_turns_{key[-1]}_low"], row[f"good_turns_{key[-1]}_high"] = share.low, share.high
    return pl.DataFrame(
        list(rows.values()),
        schema=per.select(ARM).schema | {c: pl.Float64 for c in GOODPUT_BOUNDS},
    )


def whatif_rows(run: Run) -> pl.DataFrame:
    """Per arm: the headline figures (:data:`~sessiongen.capacity.grid.WHATIF_COLUMNS`)."""
    ok = _measured(run)
    objective = run.meta.scenario.get("objective") or {}
    target = objective.get("ttft_s")
    good = (pl.col("ttft_s") <= target).mean() if target else pl.lit(None, dtype=pl.Float64)
    per_arm = ok.group_by([*ARM, "cache"]).agg(
        pl.col("ttft_s").median().alias("ttft_p50_s"),
        pl.col("ttft_s").quantile(0.9, "nearest").alias("ttft_p90_s"),
        good.alias("good_turns"),
        (pl.col("local_hit_tokens").sum() / pl.col("prompt_tokens").sum()).alias("local_hit"),
        (pl.col("external_hit_tokens").sum() / pl.col("prompt_tokens").sum()).alias("pool_hit"),
        pl.col("server_queue_s").quantile(0.9, "nearest").alias("queue_p90_s"),
        pl.len().alias("requests"),
    )
    sessions = _session_gain(run, "total_e2e_s", "session_gain").join(
        _session_gain(run, "total_ttft_s", "ttft_sum_gain").select(*ARM, "ttft_sum_gain"),
        on=ARM,
        how="full",
        coalesce=True,
    )
    turns = turn_table(run)
    later = (
        turns.filter(pl.col("turn") >= 2)
        .group_by(ARM)
        .agg(pl.col("pool_gain").median().alias("later_turn_gain"))
    )

    def side(cache: str) -> pl.DataFrame:
        return per_arm.filter(pl.col("cache") == cache).drop("cache")

    wide = side("off").join(side("on"), on=ARM, how="full", coalesce=True, suffix="_on")
    wide = wide.join(sessions, on=ARM, how="left").join(later, on=ARM, how="left")
    wide = wide.join(_later_gain(run), on=ARM, how="left")
    if target:
        wide = wide.join(_goodput(ok, target), on=ARM, how="left")
    else:
        wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(c) for c in GOODPUT_BOUNDS)
    return wide.select(
        *ARM,
        "session_gain",
        "session_gain_low",
        "session_gain_high",
        pl.col("session_gain_units").alias("sessions"),
        pl.col("session_gain_unit").alias("unit"),
        "later_gain",
        "later_gain_low",
        "later_gain_high",
        "ttft_sum_gain",
        "later_turn_gain",
        pl.col("ttft_p50_s").alias("ttft_p50_off_s"),
        pl.col("ttft_p50_s_on").alias("ttft_p50_on_s"),
        pl.col("ttft_p90_s_on").alias("ttft_p90_on_s"),
        pl.col("good_turns").alias("good_turns_off"),
        "good_turns_off_low",
        "good_turns_off_high",
        pl.col("good_turns_on"),
        "good_turns_on_low",
        "good_turns_on_high",
        pl.lit(objective.get("attainment") if target else None, dtype=pl.Float64).alias(
            "attainment"
        ),
        pl.col("local_hit_on").alias("local_hit_rate_on"),
        pl.col("pool_hit_on").alias("pool_hit_rate_on"),
        pl.col("queue_p90_s_on").alias("queue_p90_on_s"),
        (pl.col("requests").fill_null(0) + pl.col("requests_on").fill_null(0)).alias("requests"),
    ).sort(ARM)


def measured_decision(run: Run, pays_at: float) -> pl.DataFrame:
    """A run's what-if rows (both cache arms in ``run``) with the arms' stability and the
    verdict against ``pays_at``, as ``sessiongen plan`` writes a configuration's. A
    replay's rows are measurements: their intervals are the sampling ones (paired
    session bootstrap), with no model error added."""
    rows = whatif_rows(run).join(arm_stability([run]), on=ARM, how="left", nulls_equal=True)
    return with_verdicts(rows, pays_at)
