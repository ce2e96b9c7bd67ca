"""Placement policies map (session, turn) to replicas as documented."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessiongen.design import placement


def sequence(policy: str, session: int, turns: int, n: int, seed: int = 0) -> list[int]:
    """Replicas of turns 1..turns of one session."""
    return [placement.replica_for(policy, session, k, n, seed) for k in range(1, turns + 1)]


def cross_flags(replicas: list[int]) -> list[bool]:
    """Whether each turn ran on another replica than the turn before."""
    return [i > 0 and r != replicas[i - 1] for i, r in enumerate(replicas)]


def test_alternate_moves_every_turn_and_spreads_sessions() -> None:
    assert sequence("alternate", 0, 6, 2) == [0, 1, 0, 1, 0, 1]
    assert sequence("alternate", 1, 6, 2) == [1, 0, 1, 0, 1, 0]
    assert sequence("alternate", 2, 4, 3) == [2, 0, 1, 2]


def test_fixed_stays_and_spreads() -> None:
    assert sequence("fixed", 0, 4, 2) == [0, 0, 0, 0]
    assert sequence("fixed", 3, 4, 2) == [1, 1, 1, 1]


def test_move_at_moves_once() -> None:
    seq = sequence("move-at:4", 0, 5, 2)
    assert seq == [0, 0, 0, 1, 1]
    assert cross_flags(seq) == [False, False, False, True, False]


@given(st.integers(0, 50), st.integers(1, 8), st.integers(0, 100))
def test_random_is_seeded_and_in_range(session: int, n: int, seed: int) -> None:
    one = sequence("random", session, 10, n, seed)
    assert one == sequence("random", session, 10, n, seed)
    assert all(0 <= r < n for r in one)


def test_random_uses_every_replica() -> None:
    seen = {r for s in range(20) for r in sequence("random", s, 6, 3, seed=1)}
    assert seen == {0, 1, 2}


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown placement"):
        placement.replica_for("sticky", 0, 1, 2)
