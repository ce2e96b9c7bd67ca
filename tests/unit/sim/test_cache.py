"""Cache mechanics of the simulator: chain keys, block alignment, LRU, local-before-pool."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessiongen.sim.cache import (
    KeyChain,
    PromptKeys,
    SharedPool,
    _LRUKeys,
    chain_keys,
    split_hit,
)


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


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 100_000), min_size=0, max_size=300),
    st.lists(st.integers(0, 300), min_size=0, max_size=4),
    st.integers(1, 40),
)
def test_extending_a_key_chain_gives_the_keys_of_the_whole_sequence(
    tokens: list[int], cuts: list[int], block: int
) -> None:
    x = np.array(tokens, dtype=np.uint32)
    chain = KeyChain.of(x[:0], block)
    start = 0
    for cut in sorted(c for c in cuts if c <= len(x)):
        chain = chain.extend(x[start:cut])
        start = cut
    chain = chain.extend(x[start:])
    assert chain.keys.tolist() == chain_keys(x, block) and chain.tokens == len(x)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_chains_branched_and_read_in_any_order_have_the_keys_of_their_tokens(
    seed: int, block: int
) -> None:
    """Extensions are hashed when first read, several at once, into shared buffers:
    whatever the order of extending, branching and reading, keys are those of the
    tokens."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, 1000, int(rng.integers(0, 60)))
    chains: list[KeyChain] = [KeyChain.of(first, block)]
    seqs: list[np.ndarray] = [first]
    for _ in range(12):
        if rng.integers(3):  # extend some chain (often one nobody has read)
            i = int(rng.integers(len(chains)))
            piece = rng.integers(0, 1000, int(rng.integers(0, 50)))
            chains.append(chains[i].extend(piece))
            seqs.append(np.concatenate([seqs[i], piece]))
        else:  # read one
            i = int(rng.integers(len(chains)))
            assert chains[i].keys.tolist() == chain_keys(seqs[i], block)
    for i in rng.permutation(len(chains)):
        assert chains[i].keys.tolist() == chain_keys(seqs[i], block)
        assert chains[i].tokens == len(seqs[i]) and chains[i].blocks == len(seqs[i]) // block


@pytest.mark.parametrize("second", ["extend", "extend_unique"])
def test_a_chain_with_a_prefix_branched_twice_keeps_both_branches(second: str) -> None:
    """The buffer choice every extension makes (``cache._room``), on the path the
    random branching above rarely takes: a chain whose keys are a shared prefix plus
    its own, extended once (appending in its buffer, read), then again. The second
    branch copies the own keys into a buffer of its own, leaving the first's intact;
    the branch taken from a chain with no prefix shares that chain's keys, not a copy."""
    rng = np.random.default_rng(7)
    a_ids, b_ids, c_ids, d_ids = (rng.integers(0, 1000, n) for n in (100, 32, 32, 40))
    a = KeyChain.of(a_ids, 16)
    assert len(a.extend(b_ids).keys) == 8  # appended in a's buffer
    c = a.extend(c_ids)
    prefix, own = c.segments  # a's buffer was taken: a's keys are c's prefix, uncopied
    assert np.shares_memory(prefix, a.segments[1]) and len(prefix) == 6 and len(own) == 2
    d = c.extend(d_ids)
    d_keys = chain_keys(np.concatenate([a_ids, c_ids, d_ids]), 16)
    assert d.keys.tolist() == d_keys  # appended in c's buffer
    if second == "extend":
        e_ids = rng.integers(0, 1000, 40)
        e = c.extend(e_ids)
        assert e.keys.tolist() == chain_keys(np.concatenate([a_ids, c_ids, e_ids]), 16)
    else:
        e = c.extend_unique(40, np.array([5, 6], dtype=np.uint64))  # (4 + 40) // 16
        assert e.keys.tolist() == [*c.keys.tolist(), 5, 6]
    assert d.keys.tolist() == d_keys  # the first branch's keys were not written over
    assert c.keys.tolist() == chain_keys(np.concatenate([a_ids, c_ids]), 16)


def test_prompt_keys_extend_both_granularities() -> None:
    head, tail = ids((0, 3000)), ids((9000, 9700))
    whole = PromptKeys.of(np.concatenate([head, tail]), 16, 1568)
    grown = PromptKeys.of(head, 16, 1568).extend(tail)
    assert grown.tokens == whole.tokens == 3700
    assert grown.local.keys.tolist() == whole.local.keys.tolist()
    # A chunk of 1568 tokens is 98 blocks: its key is the block key where it ends (the
    # same prefix), so the pool's keys cost no hashing of their own.
    every = chain_keys(np.concatenate([head, tail]), 16)
    assert grown.pool.keys.tolist() == whole.pool.keys.tolist() == every[97::98]
    assert len(grown.pool.keys) == 3700 // 1568 == grown.pool.blocks


def test_prompt_keys_at_a_chunk_size_that_is_not_whole_blocks_chain_on_their_own() -> None:
    head, tail = ids((0, 3000)), ids((9000, 9700))
    grown = PromptKeys.of(head, 16, 1000).extend(tail)
    assert grown.pool.keys.tolist() == chain_keys(np.concatenate([head, tail]), 1000)
    unique = PromptKeys.unique(5000, 16, 1000, seed=3)
    assert len(unique.pool.keys) == 5 and len(unique.local.keys) == 312


def test_chunk_keys_share_exactly_the_prefixes_that_share_chunks() -> None:
    a, b = ids((0, 4000)), np.concatenate([ids((0, 2000)), ids((7000, 9000))])
    ka, kb = (PromptKeys.of(x, 16, 1568).pool.keys.tolist() for x in (a, b))
    assert len(ka) == len(kb) == 2
    assert ka[0] == kb[0] and ka[1] != kb[1]  # they differ from token 2000, in chunk 2


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


class OneByOneLRU:
    """The pool's LRU written key by key, as a reference for the bulk operations."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[int, float] = OrderedDict()

    def prefix_len(self, keys: list[int], now: float) -> int:
        for i, key in enumerate(keys):
            visible_at = self.keys.get(key)
            if visible_at is None or visible_at > now:
                return i
        return len(keys)

    def insert(self, keys: list[int], visible_at: float) -> None:
        for key in reversed(keys):
            seen = self.keys.get(key)
            if seen is None or seen > visible_at:
                self.keys[key] = visible_at
            self.keys.move_to_end(key)
        while len(self.keys) > self.capacity:
            self.keys.popitem(last=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_pool_lru_keeps_the_order_and_times_of_touching_key_by_key(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lru, ref = _LRUKeys(12), OneByOneLRU(12)
    for _ in range(60):
        keys = rng.integers(0, 30, int(rng.integers(0, 10))).tolist()
        at = float(rng.integers(0, 20)) if rng.integers(8) else math.inf
        if rng.integers(2):
            lru.insert(keys, at)
            ref.insert(keys, at)
            assert list(lru._keys.items()) == list(ref.keys.items())
        else:
            assert lru.prefix_len(keys, at) == ref.prefix_len(keys, at)


def test_a_unique_extension_appends_the_given_keys_and_extends_like_a_chain() -> None:
    ids = np.arange(40, dtype=np.uint64)
    base = KeyChain.of(ids, 16)  # two blocks, eight tokens of tail
    keys = np.array([11, 12, 13], dtype=np.uint64)  # (8 + 45) // 16 = 3 new blocks
    answer = base.extend_unique(45, keys)
    assert answer.tokens == 85
    assert answer.keys.tolist() == [*base.keys.tolist(), 11, 12, 13]
    # the prompt's keys are untouched, and a second extension from it is its own
    other = base.extend_unique(45, np.array([21, 22, 23], dtype=np.uint64))
    assert answer.keys.tolist()[-3:] == [11, 12, 13] and other.keys.tolist()[-3:] == [21, 22, 23]
    assert base.keys.tolist() == KeyChain.of(ids, 16).keys.tolist()
    # it extends further by ids like any chain: its head kept, new blocks hashed on
    more = answer.extend(np.arange(30, dtype=np.uint64))
    assert more.tokens == 115 and more.keys.tolist()[:5] == answer.keys.tolist()
    assert len(more.keys) == 115 // 16
    with pytest.raises(ValueError, match="expected 3"):
        base.extend_unique(45, np.array([1, 2], dtype=np.uint64))
