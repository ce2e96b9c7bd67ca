"""The planner's models of vllm-router's policies behave as the router was measured to."""

from __future__ import annotations

import numpy as np
import pytest

from sessiongen.capacity.routers import BALANCE_ABS, RouterModel


def keys(*blocks: int) -> np.ndarray:
    return np.asarray(blocks, dtype=np.uint64)


def test_round_robin_alternates_a_solo_session_and_keeps_an_even_pair_put() -> None:
    solo = RouterModel("round_robin", 2)
    assert [solo.route("s", keys(1)) for _ in range(6)] == [0, 1, 0, 1, 0, 1]
    pair = RouterModel("round_robin", 2)
    turns = [(pair.route("a", keys(1)), pair.route("b", keys(2))) for _ in range(3)]
    assert turns == [(0, 1)] * 3  # interleaved turn by turn, each session stays put


def test_consistent_hash_is_sticky_per_session_and_spreads_sessions() -> None:
    router = RouterModel("consistent_hash", 4)
    homes = {s: router.route(s, keys(1)) for s in (f"s{i}" for i in range(40))}
    assert all(router.route(s, keys(9)) == r for s, r in homes.items())
    assert len(set(homes.values())) == 4


def test_sticky_least_loaded_balances_new_sessions_then_sticks() -> None:
    router = RouterModel("sticky_least_loaded", 2)
    first = [router.route(f"s{i}", keys(i)) for i in range(4)]
    assert sorted(first) == [0, 0, 1, 1]
    assert [router.route(f"s{i}", keys(100 + i)) for i in range(4)] == first


def test_cache_aware_follows_the_prefix_and_piles_sequential_sessions_on_one_replica() -> None:
    router = RouterModel("cache_aware", 2)
    a1 = router.route("a", keys(1, 2, 3))
    router.finished(a1)
    b1 = router.route("b", keys(7, 8, 9))  # no match anywhere: least loaded, ties to 0
    router.finished(b1)
    assert a1 == b1 == 0
    router.in_flight[0] = 1  # replica 0 busy: a new prefix goes to the idle one
    assert router.route("c", keys(20, 21)) == 1
    router.in_flight[1] = 5  # busier, but it holds c's prefix: the prefix wins
    assert router.route("c", keys(20, 21, 22)) == 1


def test_cache_aware_gives_up_the_prefix_when_load_is_imbalanced() -> None:
    router = RouterModel("cache_aware", 2)
    home = router.route("a", keys(1, 2, 3))
    router.in_flight[home] = BALANCE_ABS + 10
    router.in_flight[1 - home] = 0
    assert router.route("a", keys(1, 2, 3, 4)) == 1 - home


def test_power_of_two_prefers_the_less_loaded_of_its_draws() -> None:
    router = RouterModel("power_of_two", 2, seed=3)
    router.in_flight[:] = [50, 0]
    assert all(router.route(f"s{i}", keys(i)) == 1 for i in range(20))


def test_kv_aware_is_not_modeled() -> None:
    with pytest.raises(ValueError, match="not modeled"):
        RouterModel("kv_aware", 2)
