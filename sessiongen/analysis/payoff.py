"""Does the pool pay: a run's records reduced to what-if rows, and their verdicts.

One reduction and one reading for every kind of run, so that a plan (the virtual clock)
and a replay (measured) name and mean the same figures
(:data:`sessiongen.analysis.whatif.WHATIF_COLUMNS`): per arm (placement, context, load
level) the **session gain** (whole-session end-to-end time OFF / ON,
:func:`sessiongen.analysis.latency.session_speedup`), the **later-turn gain** (median TTFT
over turns 2.. OFF / ON, every later turn pooled; the paired session bootstrap of the
per-turn speedup), the **median per-turn gain (turns 2..)** (``later_turn_gain``: the
median over turns 2.. of each turn's own OFF / ON ratio), goodput, hit rates, queueing;
then :func:`measured_decision` adds the arms' stability and the verdict at ``pays_at``.

- **Pooling** (:func:`pooled`): replicates' requests as one run whose units are
  (replicate, session), so the session gain's interval is the paired session bootstrap
  over every session of every replicate.
- **Verdict** (:func:`verdict`): "pays" when the whole 95% interval of the gain lies at
  or above the threshold, "does not pay" when wholly below, "undecided" when it
  straddles it (each side a one-sided test at 2.5%, as :func:`sessiongen.analysis.stats.
  decide_ratio` reads an interval). Where either cache arm is **unstable** at the
  cell's level (:func:`sessiongen.analysis.load.load_table`'s ``stable`` on the
  replicates' records pooled, :func:`arm_stability`), its queue grows with the run and
  the gain depends on the run's length: the verdict is "unstable (OFF queue grows)"
  (or ON, or both) instead, whatever the interval says.
- **Objective** (:func:`objective_verdict`): per cache arm, "meets" when the whole 95%
  interval of its goodput (share of turns within ``objective.ttft_s``, sessions the
  clusters) lies at or above ``objective.attainment``, "misses" when wholly below or the
  arm is unstable (its queue grows: no share holds for a longer run), "undecided"
  otherwise or below the pooled sessions a verdict needs.

Below both the planner (:mod:`sessiongen.capacity`, which adds replicates, model error
and ``--find``) and the report (:mod:`sessiongen.report.decision`, the replay's decision),
so neither imports the other for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import polars as pl

from sessiongen.analysis.hypotheses import clustered_share
from sessiongen.analysis.latency import session_speedup, speedup_table
from sessiongen.analysis.load import LEVEL_KEYS, load_table
from sessiongen.analysis.stats import MIN_SESSIONS
from sessiongen.records.run import Run

Verdict = Literal["pays", "does not pay", "undecided"]
ObjectiveVerdict = Literal["meets", "misses", "undecided"]
VERDICTS: tuple[Verdict, ...] = ("does not pay", "undecided", "pays")
#: The verdict of a cell with too few units for its interval to mean what it says.
NOT_ENOUGH = "not enough data"
#: The verdict of a cell whose OFF, ON or both arms are unstable (module doc).
UNSTABLE_VERDICTS = {
    (False, True): "unstable (OFF queue grows)",
    (True, False): "unstable (ON queue grows)",
    (False, False): "unstable (both queues grow)",
}
#: The default threshold of ``--pays-at``: a 10% shorter session.
DEFAULT_PAYS_AT = 1.1
#: Replicate ``k``'s session indices are ``k * STRIDE + index`` in a pooled run.
STRIDE = 1_000_000
#: How an unfitted profile's verdict is qualified, everywhere it is shown.
UNFITTED = "on an unfitted profile: fit one with `sessiongen fit`"


def verdict(low: float | None, high: float | None, pays_at: float) -> Verdict:
    """The gain's interval ``[low, high]`` against ``pays_at`` (module doc); a missing
    or NaN bound is "undecided"."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if low >= pays_at:
        return "pays"
    if high < pays_at:
        return "does not pay"
    return "undecided"


def objective_verdict(
    low: float | None, high: float | None, attainment: float, *, stable: bool | None = True
) -> ObjectiveVerdict:
    """One arm's goodput interval ``[low, high]`` against ``attainment`` (module doc); an
    unstable arm misses, a missing or NaN bound is "undecided"."""
    if stable is False:
        return "misses"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if low >= attainment:
        return "meets"
    if high < attainment:
        return "misses"
    return "undecided"


def qualified(verdict: str, fitted: bool) -> str:
    """A verdict as shown: qualified when the profile is not fitted (module doc)."""
    return verdict if fitted else f"{verdict}, {UNFITTED}"


def pooled(runs: Sequence[Run], *, blocks_apart: bool = False) -> Run:
    """The replicates' requests as one run, units (replicate, session) (module doc);
    with ``blocks_apart``, replicate ``k``'s blocks numbered ``k * STRIDE + block`` (one
    block's span is then one replicate's, as a throughput needs)."""
    frames = []
    for k, run in enumerate(runs):
        frame = run.requests.with_columns(
            (pl.col("session_index") + k * STRIDE).alias("session_index"),
            (pl.lit(f"r{k}:") + pl.col("session_id").cast(pl.String)).alias("session_id"),
        )
        if blocks_apart:
            frame = frame.with_columns((pl.col("block").cast(pl.Int64) + k * STRIDE).alias("block"))
        frames.append(frame)
    return replace(runs[0], requests=pl.concat(frames, how="diagonal_relaxed"))


#: The keys of a what-if cell (a cache arm's are these and ``cache``).
CELL = [k for k in LEVEL_KEYS if k != "cache"]


def arm_stability(runs: Sequence[Run]) -> pl.DataFrame:
    """Per cell (placement, context, level): ``stable_off`` / ``stable_on`` and
    ``ttft_growth_off`` / ``ttft_growth_on``, the replay's load table's ``stable`` and
    ``ttft_growth`` (:func:`sessiongen.analysis.load.load_table`, its definition
    unchanged) on the replicates' records pooled, each replicate's blocks apart."""
    table = load_table(pooled(runs, blocks_apart=True), None)
    out = table.select(*CELL).unique()
    for cache in ("off", "on"):
        arm = table.filter(pl.col("cache") == cache).select(
            *CELL,
            pl.col("stable").alias(f"stable_{cache}"),
            pl.col("ttft_growth").alias(f"ttft_growth_{cache}"),
        )
        out = out.join(arm, on=CELL, how="left", nulls_equal=True)
    return out.sort(CELL)


def unstable_verdict(stable_off: bool | None, stable_on: bool | None) -> str | None:
    """The verdict of a cell with an unstable arm (None: both stable, or not known)."""
    return UNSTABLE_VERDICTS.get((stable_off is not False, stable_on is not False))


def with_verdicts(whatif: pl.DataFrame, pays_at: float) -> pl.DataFrame:
    """``whatif`` with ``pays_at`` and each row's ``verdict`` on its session gain;
    :data:`NOT_ENOUGH` below :data:`~sessiongen.analysis.stats.MIN_SESSIONS` pooled
    units (distinct replicates' sessions, or a trace's blocks of time), where the
    interval covers far less than it says (more sessions, or a longer trace, decide;
    more ``--seeds`` only where the replicates differ); an
    unstable verdict where ``stable_off`` or ``stable_on`` is false (module doc). With
    an objective (``attainment`` set), ``objective_off`` and ``objective_on`` too."""
    rows = list(whatif.iter_rows(named=True))
    enough = [(r.get("sessions") or MIN_SESSIONS) >= MIN_SESSIONS for r in rows]
    verdicts = [
        unstable_verdict(r.get("stable_off"), r.get("stable_on"))
        or (verdict(r["session_gain_low"], r["session_gain_high"], pays_at) if ok else NOT_ENOUGH)
        for r, ok in zip(rows, enough, strict=True)
    ]
    objectives = {
        f"objective_{arm}": [
            None
            if r.get("attainment") is None
            else objective_verdict(
                r.get(f"good_turns_{arm}_low") if ok else None,
                r.get(f"good_turns_{arm}_high") if ok else None,
                r["attainment"],
                stable=r.get(f"stable_{arm}"),
            )
            for r, ok in zip(rows, enough, strict=True)
        ]
        for arm in ("off", "on")
    }
    fitted = [r.get("profile_fitted") is not False for r in rows]  # a replay's rows: measured
    return whatif.with_columns(
        pl.lit(pays_at).alias("pays_at"),
        pl.Series("verdict", verdicts, dtype=pl.String),
        pl.Series(
            "verdict_text",
            [qualified(v, ok) for v, ok in zip(verdicts, fitted, strict=True)],
            dtype=pl.String,
        ),
        *(pl.Series(name, values, dtype=pl.String) for name, values in objectives.items()),
    )


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
    sessions the clusters (:func:`~sessiongen.analysis.hypotheses.clustered_share`), wide
    (``good_turns_off_low`` .. ``good_turns_on_high``)."""
    per = ok.group_by([*ARM, "cache", "session_index"]).agg(
        (pl.col("ttft_s") <= target).sum().alias("good"), pl.len().alias("turns")
    )
    rows: dict[tuple[object, ...], dict[str, object]] = {}
    for key, sub in per.group_by([*ARM, "cache"]):
        share = clustered_share(sub["good"].to_numpy(), sub["turns"].to_numpy())
        row = rows.setdefault(key[:-1], dict(zip(ARM, key[:-1], strict=True)))
        row[f"good_turns_{key[-1]}_low"], row[f"good_turns_{key[-1]}_high"] = share.low, share.high
    return pl.DataFrame(
        list(rows.values()),
        schema=per.select(ARM).schema | {c: pl.Float64 for c in GOODPUT_BOUNDS},
    )


def whatif_rows(run: Run) -> pl.DataFrame:
    """Per arm: the headline figures (:data:`~sessiongen.analysis.whatif.WHATIF_COLUMNS`)."""
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
