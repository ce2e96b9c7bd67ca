"""A nightly suite of about 100 series with known truth: false alarms and power of the check.

One suite is what a nightly job with two placements, three context sizes and six turns
stores: 72 median-TTFT series (placement x cache x context x turn) and 36 speedup series,
108 in all (tests/support/trend_history.py draws each night). The check runs every night
on the nights so far, as the nightly job does.

- :func:`false_alarms`: flat suites (nothing changes); every finding is false. The rate
  is findings per series per check: "false alarms per 100 flat series per night" is 100
  times it.
- :func:`power`: flat for ``before`` nights, then every series steps by ``step`` (TTFT
  up, speedup down by the same factor); the share of series with a regression dated to
  the step night, after each number of nights at the new level.

bench/trend_noise.py prints both; tests/unit/trend/test_noise.py bounds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import polars as pl

from sessiongen.trend import check as tcheck
from tests.support.trend_history import Night, history_frame, night_label

PLACEMENTS = ("alternate", "fixed")
CONTEXTS = (8192, 32768, 131072)
TURNS = 6


def suite(nights: Sequence[Night], seed: int) -> pl.DataFrame:
    """One suite's history as a store frame."""
    return history_frame(nights, seed, PLACEMENTS, turns=TURNS, contexts=CONTEXTS)


def _check(frame: pl.DataFrame, upto: int) -> list[tcheck.Finding]:
    """The findings of the fitted series on nights ``0..upto-1``."""
    runs = frame.select("run_id", "started_at").unique().sort("started_at")["run_id"]
    sub = frame.filter(pl.col("run_id").is_in(runs.head(upto).to_list()))
    return [
        s.finding
        for _n, series, _c in tcheck.check_groups(sub)
        for s in series
        if s.finding is not None
    ]


def false_alarms(
    night: Night, *, seeds: Sequence[int], nights: int = 30, first_check: int = 6
) -> tuple[int, int]:
    """(findings, series checks) over flat suites checked on nights ``first_check..nights``."""
    found = checks = 0
    for seed in seeds:
        frame = suite([night] * nights, seed)
        series = frame.filter(pl.col("cache") == "off").height // nights * 3  # 2 ttft + 1 speedup
        for upto in range(first_check, nights + 1):
            found += len(_check(frame, upto))
            checks += series
    return found, checks


def power(
    night: Night, step: float, *, seeds: Sequence[int], before: int = 14, after: int = 5
) -> list[float]:
    """Share of stepped series found, dated right, after 1..``after`` nights at the new level."""
    stepped = replace(
        night,
        ttft={("*", "*", "*"): 1.0 + step},
        speedup={("*", "*", "*"): 1.0 / (1.0 + step)},
    )
    hits = [0] * after
    total = 0
    for seed in seeds:
        frame = suite([night] * before + [stepped] * after, seed)
        total += frame.filter(pl.col("cache") == "off").height // (before + after) * 3
        for m in range(1, after + 1):
            hits[m - 1] += sum(
                f["kind"] == "regression" and f["started"] == night_label(before)
                for f in _check(frame, before + m)
            )
    return [h / total for h in hits]


#: Six nights of the smoke scenario's shape (two placements, one 2k context, three
#: turns: 18 series), narrow intervals, and two cells much noisier than the rest (small
#: TTFTs, where timer noise weighs most): alternate/off turn 3 (3x) and alternate's
#: turn-3 speedup (5x).
SMOKE_LIKE = Night(
    noise=0.03,
    ci_noise=0.01,
    louder={("alternate", "speedup", 3): 5.0, ("alternate", "off", 3): 3.0},
)


def smoke_like_alarms(seeds: Sequence[int], nights: int = 6, first_check: int = 4) -> int:
    """Histories of :data:`SMOKE_LIKE` with any finding on any check night."""
    alarmed = 0
    for seed in seeds:
        frame = history_frame([SMOKE_LIKE] * nights, seed, PLACEMENTS, turns=3, contexts=(2048,))
        alarmed += any(_check(frame, upto) for upto in range(first_check, nights + 1))
    return alarmed
