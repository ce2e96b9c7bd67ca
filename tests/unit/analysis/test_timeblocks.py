"""A trace's units: blocks of consecutive requests whose length follows the data's
autocorrelation (sessiongen.analysis.timeblocks), and the coverage they buy."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import numpy as np

from sessiongen.analysis import timeblocks
from tests.support.paths import ROOT


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trace_blocks", ROOT / "bench/trace_blocks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_independent_values_are_their_own_units() -> None:
    rng = np.random.default_rng(1)
    assert timeblocks.block_length(rng.normal(size=2000)) <= 2
    assert timeblocks.block_length([1.0, 2.0]) == 1  # too short to tell
    assert timeblocks.block_length(np.ones(100)) == 1  # no variation


def test_the_block_grows_with_the_correlation() -> None:
    bench = _bench()
    rng = np.random.default_rng(2)
    lengths = []
    for phi in (0.5, 0.9, 0.97):
        off, on = bench.trace(rng, 3000, phi)
        lengths.append(timeblocks.block_length(np.log(off / on)))
    assert lengths == sorted(lengths) and lengths[0] > 1 and lengths[-1] > 3 * lengths[0], lengths


def test_block_ids_follow_the_order_and_fold_a_short_tail() -> None:
    ids = timeblocks.block_ids([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0], 3)
    # ranks 4,0,2,1,3,5,6 -> blocks 1,0,0,0,1,1,(2 alone: folded into 1)
    assert ids.tolist() == [1, 0, 0, 0, 1, 1, 1]


def test_blocks_of_time_hold_the_true_gain_where_requests_as_units_do_not() -> None:
    """bench/trace_blocks.py on a few seeded traces with queue memory (AR(1), 0.9):
    request units miss the true gain about half the time; blocks hold it near 95%."""
    out = _bench().run(trials=40, requests=1000, phi=0.9, seed=5)
    requests, blocks = out["hits"]
    assert requests / 40 <= 0.75, out
    assert blocks / 40 >= 0.85, out
