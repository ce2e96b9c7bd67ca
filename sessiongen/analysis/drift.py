"""Block drift: did an arm's latency move between its first and last block?

The OFF, ON, ON, OFF design runs each arm twice, first and last. If the system drifts
between blocks (a host warming up, a neighbour starting), the drift adds to or hides
the cache's effect. Per arm (placement x cache x context size):

- per session and turn, the **ratio** last block / first block of its TTFT;
- the arm's **test**: per session, the mean log ratio over its turns; the mean over
  sessions with a Student t interval (Student 1908; the per-session means average a
  session's turns, so they are near normal even for skewed latencies), at the
  Bonferroni-adjusted level ``1 - (1 - conf) / m`` for the ``m`` arms checked, so that a
  clean run raises no drift with probability ``conf`` (Dunn 1961). Sessions are the units:
  one session's turns share its blocks and are not independent. ``arm_drift`` is
  ``exp`` of that mean, with its interval.
- per turn, the **drift** (geometric mean of that turn's ratios over sessions) is
  compared with **that turn's effect** (its ON/OFF speedup): a drift of 1.3 hides nothing
  on a turn the cache speeds up 4x, and everything on a cold turn 1 (effect 1).

A row is *flagged* when the arm's drift is significant (its interval excludes 1 and it
exceeds ``min_drift``, 2%), the turn's drift exceeds ``min_drift`` too, and ``|log
drift| > |log effect|``. An arm is checked only with at least ``min_units`` (3)
sessions in both blocks: the t interval needs two degrees of freedom to be of any use
(with 2 sessions and 4 arms its half-width is 51 standard errors). Smaller arms say
``not checked (n < 3)`` in ``status``, and the report and console say so instead of
"no drift". Measured on synthetic runs (40 seeds each, 4 turns, 6% request noise, 30%
spread between sessions): a clean run flagged some turn in 2.5% of runs at 3, 4 and 8
sessions; a 20% drift of one arm was flagged in 58%, 93% and 100% of runs, a 10% drift
in 23%, 43% and 98% (tests/unit/analysis/test_drift.py bounds these).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from sessiongen.analysis import stats
from sessiongen.analysis.frames import finite_or_none, frame_from_rows, partition
from sessiongen.analysis.latency import speedup_table
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.records.format import ARM_KEYS
from sessiongen.records.run import Run

#: Block drift is judged only when it is larger than this (relative) ...
DRIFT_MIN = 0.02
#: ... and rests on at least this many sessions seen in both blocks.
DRIFT_MIN_UNITS = 3

GROUP = [*ARM_KEYS, "context_tokens"]
DRIFT_VALUES: dict[str, pl.DataType] = {
    "turn": pl.Int64(),
    "first_block": pl.Int64(),
    "last_block": pl.Int64(),
    "n_units": pl.Int64(),
    "drift": pl.Float64(),
    "effect": pl.Float64(),
    "arm_drift": pl.Float64(),
    "arm_drift_ci_low": pl.Float64(),
    "arm_drift_ci_high": pl.Float64(),
    "checked": pl.Boolean(),
    "significant": pl.Boolean(),
    "exceeds_effect": pl.Boolean(),
    "flagged": pl.Boolean(),
    "status": pl.String(),
}


def not_checked(min_units: int = DRIFT_MIN_UNITS) -> str:
    """The status of an arm with too few sessions to judge."""
    return f"not checked (n < {min_units})"


def _log_ratios(sub: pl.DataFrame) -> tuple[pl.DataFrame, int, int] | None:
    """Per (session, turn): log TTFT last block / first block; None with one block."""
    blocks = sorted(sub["block_in_placement"].drop_nulls().unique().to_list())
    if len(blocks) < 2:
        return None
    pick = ["session_index", "turn", "ttft_s"]
    first = sub.filter(pl.col("block_in_placement") == blocks[0]).select(pick)
    last = sub.filter(pl.col("block_in_placement") == blocks[-1]).select(pick)
    pairs = (
        first.join(last, on=["session_index", "turn"], suffix="_last")
        .filter(pl.col("session_index").is_not_null(), pl.col("ttft_s") > 0)
        .filter(pl.col("ttft_s_last") > 0)
        .with_columns(log_ratio=(pl.col("ttft_s_last") / pl.col("ttft_s")).log())
    )
    return pairs, int(blocks[0]), int(blocks[-1])


def _arm_interval(pairs: pl.DataFrame, conf: float) -> stats.Interval:
    """exp of the mean over sessions of each session's mean log ratio, t interval."""
    per_session = pairs.group_by("session_index").agg(pl.col("log_ratio").mean())
    ci = stats.t_interval(per_session["log_ratio"].to_numpy(), conf=conf)
    return stats.Interval(math.exp(ci.estimate), math.exp(ci.low), math.exp(ci.high), ci.n)


def _status(checked: bool, significant: bool, flagged: bool, min_units: int) -> str:
    if not checked:
        return not_checked(min_units)
    if flagged:
        return "drift larger than the effect"
    return "drift, smaller than the effect" if significant else "no drift found"


def _effects(speedups: pl.DataFrame) -> dict[tuple[Any, ...], float]:
    """(placement, context_tokens, turn) -> speedup."""
    return {
        (r["placement"], r["context_tokens"], r["turn"]): r["speedup"]
        for r in speedups.iter_rows(named=True)
        if r["speedup"] is not None
    }


def _turn_rows(
    key: dict[str, object],
    pairs: pl.DataFrame,
    arm: stats.Interval,
    effects: dict[tuple[Any, ...], float],
    min_drift: float,
    checked: bool,
    min_units: int,
) -> list[dict[str, object]]:
    """One row per turn of one arm (with its :func:`_status`)."""
    significant = checked and arm.excludes(1.0) and abs(arm.estimate - 1.0) > min_drift
    rows = []
    for turn_key, turn in partition(pairs.sort("turn"), ["turn"]):
        drift = math.exp(float(np.mean(turn["log_ratio"].to_numpy())))
        effect = effects.get((key["placement"], key["context_tokens"], turn_key["turn"]), 1.0)
        exceeds = abs(math.log(drift)) > abs(math.log(effect)) if effect > 0 else False
        flagged = significant and exceeds and abs(drift - 1.0) > min_drift
        rows.append(
            {
                "turn": turn_key["turn"],
                "n_units": turn["session_index"].n_unique(),
                "drift": drift,
                "effect": effect,
                "arm_drift": finite_or_none(arm.estimate),
                "arm_drift_ci_low": finite_or_none(arm.low),
                "arm_drift_ci_high": finite_or_none(arm.high),
                "checked": checked,
                "significant": significant,
                "exceeds_effect": exceeds,
                "flagged": flagged,
                "status": _status(checked, significant, flagged, min_units),
            }
        )
    return rows


def block_drift(
    run: Run,
    *,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
    min_drift: float = DRIFT_MIN,
    min_units: int = DRIFT_MIN_UNITS,
    speedups: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """First vs last block of each arm, per turn, against that turn's effect.

    One row per (placement, cache, context size, turn) of arms with two or more blocks;
    see the module docstring. ``boot.conf`` is the family-wise confidence level.
    """
    speedups = speedup_table(run, boot=boot) if speedups is None else speedups
    effects = _effects(speedups)
    arms = []
    for key, sub in partition(run.ok, GROUP):
        found = _log_ratios(sub)
        if found is not None and not found[0].is_empty():
            arms.append((key, *found))
    checked = [a for a in arms if a[1]["session_index"].n_unique() >= min_units]
    conf = 1.0 - (1.0 - boot.conf) / max(1, len(checked))
    rows = []
    for key, pairs, first, last in arms:
        ok = pairs["session_index"].n_unique() >= min_units
        arm = _arm_interval(pairs, conf) if ok else stats.Interval(np.nan, np.nan, np.nan, 0)
        for row in _turn_rows(key, pairs, arm, effects, min_drift, ok, min_units):
            rows.append({**key, **row, "first_block": first, "last_block": last})
    return frame_from_rows(rows, GROUP, run.requests, DRIFT_VALUES).sort([*GROUP, "turn"])


def drift_units(run: Run) -> pl.DataFrame:
    """Per arm with two or more blocks: sessions seen in both its first and last block."""
    rows = []
    for key, sub in partition(run.ok, GROUP):
        found = _log_ratios(sub)
        if found is not None:
            rows.append({**key, "n_units": found[0]["session_index"].n_unique()})
    return frame_from_rows(rows, GROUP, run.requests, {"n_units": pl.Int64()})


def drift_verdict(units: pl.DataFrame, min_units: int = DRIFT_MIN_UNITS) -> str | None:
    """One sentence on the arms too small to check (:func:`drift_units`), else None."""
    unchecked = units.filter(pl.col("n_units") < min_units)
    if unchecked.is_empty():
        return None
    most = int(unchecked["n_units"].to_numpy().max())
    return (
        f"Block drift {not_checked(min_units)} in {unchecked.height} of {units.height} arms: "
        f"{most} sessions seen in both blocks, {min_units} needed."
    )
