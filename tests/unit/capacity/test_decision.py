"""The pool decision's pieces: verdicts on intervals, the bisection, replicates pooled."""

from __future__ import annotations

import math

import polars as pl
import pytest

from sessiongen.analysis.payoff import (
    STRIDE,
    objective_verdict,
    pooled,
    unstable_verdict,
    verdict,
    with_verdicts,
)
from sessiongen.capacity.decision import bisect, parse_find, replicate_sets, value_text
from sessiongen.errors import UserError


def test_a_verdict_reads_the_whole_interval_against_the_threshold() -> None:
    assert verdict(1.12, 1.30, 1.1) == "pays"
    assert verdict(1.10, 1.30, 1.1) == "pays"  # at the threshold counts as reaching it
    assert verdict(0.95, 1.09, 1.1) == "does not pay"
    assert verdict(1.05, 1.15, 1.1) == "undecided"  # straddles
    assert verdict(math.nan, 1.3, 1.1) == "undecided"
    assert verdict(None, None, 1.1) == "undecided"


def test_with_verdicts_adds_the_threshold_and_a_verdict_per_row() -> None:
    rows = pl.DataFrame({"session_gain_low": [1.2, 1.0, 0.8], "session_gain_high": [1.4, 1.3, 1.0]})
    out = with_verdicts(rows, 1.1)
    assert out["verdict"].to_list() == ["pays", "undecided", "does not pay"]
    assert out["pays_at"].to_list() == [1.1, 1.1, 1.1]
    few = with_verdicts(rows.with_columns(sessions=pl.Series([4, 5, 4])), 1.1)
    # below five units the interval means less than it says: "not enough data", not a
    # verdict (the middle row has five and reads its interval)
    assert few["verdict"].to_list() == ["not enough data", "undecided", "not enough data"]
    enough = with_verdicts(rows.with_columns(sessions=pl.Series([5, 5, 6])), 1.1)
    assert enough["verdict"].to_list() == ["pays", "undecided", "does not pay"]


def test_an_unstable_arm_overrides_the_interval_and_says_which() -> None:
    rows = pl.DataFrame({
        "session_gain_low": [1.2, 1.2, 0.8, 1.2, 1.2],
        "session_gain_high": [1.4, 1.4, 1.0, 1.4, 1.4],
        "sessions": [6, 6, 6, 3, 6],
        "stable_off": [True, False, True, False, None],
        "stable_on": [True, True, False, False, True],
    })  # fmt: skip
    assert with_verdicts(rows, 1.1)["verdict"].to_list() == [
        "pays",
        "unstable (OFF queue grows)",
        "unstable (ON queue grows)",
        "unstable (both queues grow)",  # even with too few sessions to decide
        "pays",  # stability not known (a what-if table from before): the interval decides
    ]
    assert unstable_verdict(True, True) is None and unstable_verdict(None, None) is None


def _gain_verdict(calls: list[float]) -> object:
    """A synthetic monotone gain x / 10 with a +-0.05 interval, against 1.1: does not pay
    below x = 10.5, pays from x = 11.5, undecided between."""

    def at(x: float) -> str:
        calls.append(x)
        return verdict(x / 10 - 0.05, x / 10 + 0.05, 1.1)

    return at


def test_bisection_brackets_the_flip_of_an_integer_key_with_its_undecided_region() -> None:
    calls: list[float] = []
    b = bisect(_gain_verdict(calls), 1, 64, integer=True, steps=10)  # type: ignore[arg-type]
    assert b.flips and (b.first, b.last) == ("does not pay", "pays")
    assert (b.below, b.above) == (10, 12)  # 10: does not pay, 11: undecided, 12: pays
    assert b.undecided == (11, 11)
    assert len(calls) == len(set(calls))  # each value planned once
    # the ends, the geometric interior grid (3, 8, 23), then the differing pair 8..23
    # halved (14 pays, 11 undecided), and each of its two edges halved (9, 12; 10)
    assert calls == [1, 64, 3, 8, 23, 14, 11, 9, 12, 10]
    assert "does not pay at gib=1..10; undecided at gib=11; pays at gib=12..64" in b.text("gib")


def test_bisection_of_a_float_key_narrows_both_edges() -> None:
    b = bisect(_gain_verdict([]), 2.0, 20.0, steps=12)  # type: ignore[arg-type]
    assert b.below < 10.5 <= b.undecided[0]  # type: ignore[index]
    # midpoints are rounded to 4 significant digits, so 11.5 itself (undecided: 1.15 - 0.05
    # falls a rounding error short of 1.1) can be planned
    assert b.undecided[1] <= 11.5 < b.above  # type: ignore[index]
    assert b.above - 11.5 < 0.05 and 10.5 - b.below < 0.05


def test_bisection_without_an_undecided_region_gives_adjacent_values() -> None:
    b = bisect(lambda x: "pays" if x >= 5 else "does not pay", 1, 16, integer=True)
    assert (b.below, b.above, b.undecided) == (4, 5, None)


def test_one_verdict_over_the_range_is_no_flip() -> None:
    calls: list[float] = []
    b = bisect(lambda x: calls.append(x) or "pays", 1, 256, integer=True)  # type: ignore[func-returns-value]
    assert not b.flips and calls == [1, 256, 4, 16, 64]  # the interior planned all the same
    assert b.text("gib") == "pays over the whole range gib=1..256 (5 values planned)"


def test_find_specs_parse_and_bad_ones_are_one_line() -> None:
    assert parse_find("target.sim.pool_capacity_gib=1:256") == (
        "target.sim.pool_capacity_gib", 1.0, 256.0, True)  # fmt: skip
    assert parse_find("a.b=0.5:8")[3] is False
    for bad in ("a.b", "a.b=1", "a.b=x:2", "a.b=4:2", "=1:2"):
        with pytest.raises(UserError, match="--find"):
            parse_find(bad)
    assert value_text(3.0, integer=True) == "3" and value_text(3.0, integer=False) == "3.0"


def test_replicate_zero_is_the_scenario_as_given_the_others_reseeded_and_drawn() -> None:
    assert replicate_sets(0, 7, [{"itl_base_s": 0.2}]) == []
    assert replicate_sets(2, 7, []) == ["seed=9"]
    draws = [{"itl_base_s": 0.1}, {"itl_base_s": 0.2, "hit_overhead_s": [0.0, 0.5]}]
    assert replicate_sets(2, 7, draws) == [
        "seed=9", "target.sim.itl_base_s=0.2", "target.sim.hit_overhead_s=[0.0, 0.5]"]  # fmt: skip


def test_pooled_replicates_keep_their_sessions_apart() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class FakeRun:
        requests: pl.DataFrame

    runs = [
        FakeRun(pl.DataFrame({"session_index": [0, 1], "session_id": ["a", "b"]})) for _ in range(3)
    ]
    out = pooled(runs)  # type: ignore[arg-type]
    assert out.requests["session_index"].to_list() == [0, 1, STRIDE, STRIDE + 1, 2 * STRIDE,
                                                       2 * STRIDE + 1]  # fmt: skip
    assert out.requests["session_id"].n_unique() == 6


def test_pooled_blocks_apart_numbers_each_replicates_blocks_of_its_own() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class FakeRun:
        requests: pl.DataFrame

    frame = pl.DataFrame({"session_index": [0, 1], "session_id": ["a", "b"], "block": [0, 1]})
    runs = [FakeRun(frame.with_columns(pl.col("block").cast(pl.Int32))) for _ in range(2)]
    assert pooled(runs).requests["block"].to_list() == [0, 1, 0, 1]  # type: ignore[arg-type]
    apart = pooled(runs, blocks_apart=True)  # type: ignore[arg-type]
    assert apart.requests["block"].to_list() == [0, 1, STRIDE, STRIDE + 1]


def test_an_arm_meets_the_objective_only_with_its_whole_interval_above_attainment() -> None:
    assert objective_verdict(0.92, 0.99, 0.9) == "meets"
    assert objective_verdict(0.9, 0.99, 0.9) == "meets"
    assert objective_verdict(0.5, 0.89, 0.9) == "misses"
    assert objective_verdict(0.85, 0.95, 0.9) == "undecided"
    assert objective_verdict(None, 0.95, 0.9) == "undecided"
    assert objective_verdict(float("nan"), 0.95, 0.9) == "undecided"
    assert objective_verdict(0.95, 0.99, 0.9, stable=False) == "misses"  # its queue grows
    assert objective_verdict(0.95, 0.99, 0.9, stable=None) == "meets"  # not known: the share


def test_with_verdicts_gives_each_arm_an_objective_verdict_when_there_is_one() -> None:
    rows = pl.DataFrame({
        "session_gain_low": [1.2, 1.2, 1.2], "session_gain_high": [1.5, 1.5, 1.5],
        "sessions": [12, 3, 12], "attainment": [0.9, 0.9, None],
        "good_turns_off_low": [0.5, 0.95, 0.5], "good_turns_off_high": [0.7, 0.99, 0.7],
        "good_turns_on_low": [0.91, 0.95, 0.91], "good_turns_on_high": [0.99, 0.99, 0.99],
    })  # fmt: skip
    out = with_verdicts(rows, 1.1)
    assert out["objective_off"].to_list() == ["misses", "undecided", None]  # 3 sessions: too few
    assert out["objective_on"].to_list() == ["meets", "undecided", None]  # no objective: null
