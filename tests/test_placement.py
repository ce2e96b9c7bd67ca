"""Placement policies map (session, turn) to replicas as documented."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiongen.replay import placement


def test_alternate_moves_every_turn_and_spreads_sessions() -> None:
    assert placement.sequence("alternate", 0, 6, 2) == [0, 1, 0, 1, 0, 1]
    assert placement.sequence("alternate", 1, 6, 2) == [1, 0, 1, 0, 1, 0]
    assert placement.sequence("alternate", 2, 4, 3) == [2, 0, 1, 2]


def test_fixed_stays_and_spreads() -> None:
    assert placement.sequence("fixed", 0, 4, 2) == [0, 0, 0, 0]
    assert placement.sequence("fixed", 3, 4, 2) == [1, 1, 1, 1]


def test_move_at_moves_once() -> None:
    seq = placement.sequence("move-at:4", 0, 5, 2)
    assert seq == [0, 0, 0, 1, 1]
    assert placement.cross_flags(seq) == [False, False, False, True, False]


@given(st.integers(0, 50), st.integers(1, 8), st.integers(0, 100))
def test_random_is_seeded_and_in_range(session: int, n: int, seed: int) -> None:
    one = placement.sequence("random", session, 10, n, seed)
    assert one == placement.sequence("random", session, 10, n, seed)
    assert all(0 <= r < n for r in one)


def test_random_uses_every_replica() -> None:
    seen = {r for s in range(20) for r in placement.sequence("random", s, 6, 3, seed=1)}
    assert seen == {0, 1, 2}


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown placement"):
        placement.replica_for("sticky", 0, 1, 2)
