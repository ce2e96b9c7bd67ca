"""Cache mechanics of the simulator: chain keys, block alignment, LRU, local-before-pool."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessiongen.sim.cache import LocalPrefixCache, SharedPool, chain_keys, split_hit


def ids(*ranges: tuple[int, int]) -> np.ndarray:
    return np.concatenate([np.arange(a, b, dtype=np.uint32) for a, b in ranges])


def test_chain_keys_depend_on_the_whole_prefix() -> None:
    a = chain_keys(ids((0, 64)), 16)
    b = chain_keys(np.concatenate([[7], ids((1, 64))]).astype(np.uint32), 16)
    assert len(a) == 4
    # Changing token 0 changes every key after it, not only block 0's.
    assert all(x != y for x, y in zip(a, b, strict=True))
    # Same prefix, different tail: the shared whole blocks keep their keys.
    c = chain_keys(np.concatenate([ids((0, 48)), ids((900, 916))]), 16)
    assert c[:3] == a[:3] and c[3] != a[3]


def test_chain_keys_ignore_the_partial_tail() -> None:
    assert chain_keys(ids((0, 15)), 16) == []
    assert chain_keys(ids((0, 47)), 16) == chain_keys(ids((0, 32)), 16)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 100_000), min_size=0, max_size=200),
    st.lists(st.integers(0, 100_000), min_size=0, max_size=200),
    st.integers(1, 40),
)
# Found by hypothesis: all-zero blocks scrambled to key 0 at every position.
@example(head=[], tail=[0, 0], block=1)
@example(head=[0, 0, 0, 0], tail=[], block=2)
def test_chain_keys_agree_exactly_on_common_whole_blocks(
    head: list[int], tail: list[int], block: int
) -> None:
    x = np.array(head + tail, dtype=np.uint32)
    y = np.array(head + [t + 1 for t in tail], dtype=np.uint32)
    kx, ky = chain_keys(x, block), chain_keys(y, block)
    shared = len(head) // block
    assert kx[:shared] == ky[:shared]
    if tail:
        first_diff = len(head) // block
        assert kx[first_diff:] != ky[first_diff:] or len(x) // block <= first_diff
    assert len(set(kx)) == len(kx)


def test_local_hit_is_block_aligned_and_tail_recomputed() -> None:
    cache = LocalPrefixCache(capacity_tokens=10_000, block_tokens=16)
    first = ids((0, 100))  # 6 whole blocks + 4 tail tokens
    cache.insert(cache.keys(first))
    assert cache.cached_tokens == 96
    again = np.concatenate([first, ids((5000, 5032))])
    # The 4 tail tokens of the first prompt sit in a block that now differs: recomputed.
    assert cache.lookup(cache.keys(again), len(again) - 1) == 96


def test_full_hit_keeps_one_token_to_compute() -> None:
    cache = LocalPrefixCache(capacity_tokens=10_000, block_tokens=16)
    prompt = ids((0, 64))
    cache.insert(cache.keys(prompt))
    assert cache.lookup(cache.keys(prompt), len(prompt) - 1) == 48


def test_lru_eviction_at_capacity_drops_least_recent_prompt_tail_first() -> None:
    cache = LocalPrefixCache(capacity_tokens=64, block_tokens=16)  # 4 blocks
    a, b = ids((0, 48)), ids((1000, 1032))  # 3 blocks, 2 blocks
    cache.insert(cache.keys(a))
    cache.insert(cache.keys(b))
    assert cache.cached_tokens == 64 and cache.evicted_tokens == 16
    # a lost its last block (its tail), not its head, so 2 of its blocks still hit.
    assert cache.lookup(cache.keys(a), 10**9) == 32
    assert cache.lookup(cache.keys(b), 10**9) == 32
    # Refreshing a makes b the least recent; b's blocks go next.
    cache.insert(cache.keys(a))
    assert cache.lookup(cache.keys(a), 10**9) == 48
    assert cache.lookup(cache.keys(b), 10**9) == 16


def test_pool_is_chunk_aligned_and_bounded_in_bytes() -> None:
    pool = SharedPool(capacity_bytes=3 * 100 * 8, chunk_tokens=100, bytes_per_token=8)
    prompt = ids((0, 450))
    pool.insert(pool.keys(prompt))
    assert pool.cached_tokens == 300  # 4 whole chunks, room for 3
    probe = np.concatenate([ids((0, 450)), ids((7000, 7032))])
    assert pool.lookup(pool.keys(probe), len(probe) - 1) == 300
    pool.clear()
    assert pool.lookup(pool.keys(probe), len(probe) - 1) == 0


def test_pool_serves_only_what_lies_beyond_the_local_hit() -> None:
    assert split_hit(local_tokens=96, pool_prefix=300) == (96, 204)
    assert split_hit(local_tokens=320, pool_prefix=300) == (320, 0)
    assert split_hit(local_tokens=0, pool_prefix=0) == (0, 0)


def test_position_is_part_of_every_key() -> None:
    zeros = np.zeros(64, dtype=np.uint32)
    for block in (1, 2, 16):
        keys = chain_keys(zeros, block)
        assert len(set(keys)) == len(keys) == 64 // block
