"""The concurrency rule: which loads are open loops, their levels and their slots."""

from __future__ import annotations

from sessiongen import scenario
from sessiongen.design.blocks import plan_blocks
from sessiongen.design.load import concurrency, in_flight, load_levels, open_loop
from tests.support.paths import SCENARIOS


def test_a_closed_loop_keeps_its_level_in_flight() -> None:
    sc = scenario.load(SCENARIOS / "pressure32k.toml", ["load.max_in_flight=3"])
    assert not open_loop(sc)
    assert load_levels(sc) == (1.0, 8.0)
    assert concurrency(sc, 8.0) == 8
    assert in_flight(sc, 8.0, sessions=5) == 5


def test_an_open_loop_is_capped_whatever_its_rate() -> None:
    sc = scenario.load(
        SCENARIOS / "smoke.toml",
        ['load.arrival="poisson"', "load.levels=[0.5]", "load.max_in_flight=3"],
    )
    assert open_loop(sc)
    assert concurrency(sc, 0.5) == 3
    assert in_flight(sc, 0.5, sessions=1) == 1


def test_a_trace_has_no_level_only_its_cap() -> None:
    sc = scenario.load(SCENARIOS / "traces" / "chat-replay.toml", ["load.max_in_flight=2"])
    assert open_loop(sc)
    assert load_levels(sc) == (None,)
    assert concurrency(sc, None) == 2
    assert {b.level for b in plan_blocks(sc, list(sc.design.blocks))} == {None}
