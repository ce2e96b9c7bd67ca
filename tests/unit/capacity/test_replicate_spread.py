"""One replicate's spread is read from its pooled what-if rows, not computed again."""

from __future__ import annotations

from pathlib import Path

from polars.testing import assert_frame_equal

from sessiongen import scenario
from sessiongen.analysis import load_run
from sessiongen.analysis.payoff import pooled, whatif_rows
from sessiongen.capacity.plan import replicate_spread
from sessiongen.capacity.virtual import virtual_replay
from tests.support.paths import ROOT


def test_one_replicate_spread_is_its_pooled_rows(tmp_path: Path) -> None:
    sc = scenario.load(
        ROOT / "scenarios" / "smoke.toml", ["driver.concurrency=1", 'design.blocks=["off", "on"]']
    )
    runs = [load_run(virtual_replay(sc, tmp_path, tokens="shape"))]
    rows = whatif_rows(pooled(runs))
    given = replicate_spread(runs, pooled_rows=rows)
    assert_frame_equal(given, replicate_spread(runs), check_row_order=False)
    assert given["session_gain_seed_min"].to_list() == rows["session_gain"].to_list()
