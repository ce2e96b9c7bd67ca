"""The pool decision held out on real replicas: planned gains and verdicts against measured.

A real replay of a scenario's OFF and ON arms (one run, or single-arm runs merged) and a
plan of the same scenario reduce to the same what-if rows by the same function
(:func:`sessiongen.analysis.payoff.whatif_rows`: the session gain and the later-turn
gain, each with its paired
session bootstrap interval) and get their verdicts against one threshold by the same
function (:func:`sessiongen.analysis.payoff.with_verdicts`, the arms' stability included). Per cell
(placement, context, sessions in flight, and whatever keys the caller adds, such as the
KV cache size):

- ``{gain}_error`` = planned / measured - 1 for the session gain and the later-turn gain;
- ``verdict_planned`` and ``verdict_measured``, and ``agree`` when they are the same;
- ``decided``: the measured interval excludes the threshold (its verdict is "pays" or
  "does not pay"); the goal is a planned verdict right in every decided cell
  (``right`` is ``agree`` there, null elsewhere). A cell the measurement leaves undecided
  says nothing about the plan's verdict, whatever it is.

:func:`summary` gives per group (say, per level) the median and worst absolute errors,
the share within :data:`GOAL` and the verdict counts. Nothing here runs or plans
anything; the callers are ``bench/heldout_decision.py`` and the real-stack tier.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from sessiongen.analysis.payoff import ARM
from sessiongen.analysis.payoff import measured_decision as measured_decision

#: The gains compared (what-if columns, each with ``_low`` and ``_high``).
GAINS = ("session_gain", "later_gain")
#: The goal for a cell: the planned gain within 15% of the measured one.
GOAL = 0.15
#: Verdicts that a measured interval excluding the threshold gives.
DECIDED = ("pays", "does not pay")


def _side(frame: pl.DataFrame, keys: Sequence[str], name: str) -> pl.DataFrame:
    return frame.select(
        *keys,
        *(
            pl.col(f"{g}{end}").alias(f"{g}_{name}{end}")
            for g in GAINS
            for end in ("", "_low", "_high")
        ),
        pl.col("sessions").alias(f"sessions_{name}"),
        pl.col("verdict").alias(f"verdict_{name}"),
    )


def compare(
    planned: pl.DataFrame, measured: pl.DataFrame, *, keys: Sequence[str] = ()
) -> pl.DataFrame:
    """Per cell (``ARM`` plus ``keys``): both sides' gains, intervals and verdicts, the
    errors and the verdict agreement (module doc). Cells on one side only are dropped."""
    on = [*keys, *ARM]
    table = _side(planned, on, "planned").join(
        _side(measured, on, "measured"), on=on, how="inner", nulls_equal=True
    )
    decided = pl.col("verdict_measured").is_in(DECIDED)
    agree = pl.col("verdict_planned") == pl.col("verdict_measured")
    return table.with_columns(
        *(
            (pl.col(f"{g}_planned") / pl.col(f"{g}_measured") - 1).alias(f"{g}_error")
            for g in GAINS
        ),
        agree.alias("agree"),
        decided.alias("decided"),
        pl.when(decided).then(agree).otherwise(None).alias("right"),
    ).sort(on)


def summary(table: pl.DataFrame, by: Sequence[str] = ("load_level",)) -> pl.DataFrame:
    """Per group: cells, the median and worst |error| of each gain and the share within
    :data:`GOAL`, verdicts that agree, cells decided by the measurement and the planned
    verdict right in them."""
    aggs: list[pl.Expr] = [pl.len().alias("cells")]
    for g in GAINS:
        err = pl.col(f"{g}_error").abs()
        aggs += [
            err.median().alias(f"{g}_median_abs"),
            err.max().alias(f"{g}_worst_abs"),
            (err <= GOAL).mean().alias(f"{g}_within_goal"),
        ]
    aggs += [
        pl.col("agree").sum().alias("agree"),
        pl.col("decided").sum().alias("decided"),
        pl.col("right").sum().alias("right"),
    ]
    return table.group_by(list(by)).agg(aggs).sort(list(by))
