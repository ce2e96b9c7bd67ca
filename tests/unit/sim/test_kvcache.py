"""The replica's KV cache: block alignment, holding, LRU tail-first eviction, accounting.

The last test checks the run-based tree against a per-block reference written the way
vLLM's block pool reads (a free queue of blocks, freed in reverse order, allocated from
the head), on random sequences of operations.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from sessiongen.sim.cache import KeyChain
from sessiongen.sim.kvcache import KVCache, KVHold


def ids(*ranges: tuple[int, int]) -> NDArray[np.uint32]:
    return np.concatenate([np.arange(a, b, dtype=np.uint32) for a, b in ranges])


def keys(tokens: NDArray[np.uint32], block: int = 16) -> NDArray[np.uint64]:
    return KeyChain.of(tokens, block).keys


def run(cache: KVCache, k: NDArray[np.uint64], tokens: int) -> KVHold:
    """A request that finds its prefix, computes ``tokens`` tokens and is still running."""
    hold = cache.new_hold()
    match = cache.match(k, (tokens - 1) // cache.block_tokens)
    cache.acquire(hold, match)
    assert cache.grow(hold, cache.blocks_for(tokens) - hold.logical)
    cache.commit(hold, k, tokens // cache.block_tokens)
    return hold


def hit(cache: KVCache, k: NDArray[np.uint64], limit: int = 10**9) -> int:
    return cache.match(k, limit).blocks * cache.block_tokens


def test_hits_are_block_aligned_and_the_tail_is_recomputed() -> None:
    cache = KVCache(capacity_blocks=100, block_tokens=16)
    first = ids((0, 100))  # 6 whole blocks + 4 tail tokens
    cache.release(run(cache, keys(first), 100))
    assert cache.cached_blocks == 6 and cache.used_blocks == 0
    again = np.concatenate([first, ids((5000, 5032))])
    # The 4 tail tokens of the first prompt sit in a block that now differs: recomputed.
    assert hit(cache, keys(again)) == 96


def test_a_full_hit_keeps_one_token_to_compute() -> None:
    cache = KVCache(capacity_blocks=100, block_tokens=16)
    prompt = ids((0, 64))
    cache.release(run(cache, keys(prompt), 64))
    assert hit(cache, keys(prompt), (64 - 1) // 16) == 48


def test_lru_eviction_at_capacity_drops_least_recent_prompt_tail_first() -> None:
    cache = KVCache(capacity_blocks=4, block_tokens=16)
    a, b = keys(ids((0, 48))), keys(ids((1000, 1032)))  # 3 blocks, 2 blocks
    cache.release(run(cache, a, 48))
    cache.release(run(cache, b, 32))  # needs 2 blocks, 1 free: a's tail goes
    assert cache.cached_blocks == 4 and cache.evicted_blocks == 1
    assert hit(cache, a) == 32 and hit(cache, b) == 32
    # a again: it holds its 2 cached blocks and needs 1 more; b is least recent now.
    cache.release(run(cache, a, 48))
    assert hit(cache, a) == 48 and hit(cache, b) == 16


def test_running_requests_hold_their_blocks_and_block_allocation() -> None:
    cache = KVCache(capacity_blocks=10, block_tokens=10)
    a = run(cache, keys(ids((0, 60)), 10), 60)
    assert (cache.used_blocks, cache.available_blocks, cache.usage) == (6, 4, 0.6)
    b = cache.new_hold()
    assert not cache.grow(b, 5)  # nothing changes when it does not fit
    assert cache.available_blocks == 4 and b.raw == 0
    cache.release(a)  # still cached, but free: available again
    assert (cache.used_blocks, cache.cached_blocks, cache.available_blocks) == (0, 6, 10)
    assert cache.grow(b, 5)  # 4 free + the least recent cached one: a's tail
    assert cache.evicted_blocks == 1 and hit(cache, keys(ids((0, 60)), 10)) == 50


def test_a_hit_inside_a_run_splits_it_and_holds_only_the_head() -> None:
    cache = KVCache(capacity_blocks=10, block_tokens=10)
    long = keys(ids((0, 80)), 10)
    cache.release(run(cache, long, 80))  # one run of 8 blocks
    short = keys(np.concatenate([ids((0, 30)), ids((900, 950))]), 10)
    h = run(cache, short, 80)  # hits 3 blocks, adds 5: 2 never used + 3 evicted
    assert h.logical == 8 and cache.used_blocks == 8 and cache.evicted_blocks == 3
    # long's head is held through short; 2 blocks of its tail are cached and free.
    assert cache.cached_blocks == 10 and cache.available_blocks == 2
    assert hit(cache, long) == 50
    cache.release(h)
    assert hit(cache, short) == 80 and cache.used_blocks == 0


def test_the_same_prefix_computed_twice_at_once_keeps_both_copies() -> None:
    cache = KVCache(capacity_blocks=10, block_tokens=10)
    k = keys(ids((0, 40)), 10)
    a, b = cache.new_hold(), cache.new_hold()
    for h in (a, b):  # both admitted before either had computed anything
        cache.acquire(h, cache.match(k, 3))
        assert cache.grow(h, 4)
    cache.commit(a, k, 4)
    cache.commit(b, k, 4)  # finds a's blocks: holds them, its own copies stay uncached
    assert (cache.used_blocks, cache.cached_blocks) == (8, 4)
    cache.release(a)
    assert cache.used_blocks == 8  # b holds its own copies and, through its path, a's
    cache.release(b)
    assert (cache.used_blocks, cache.cached_blocks) == (0, 4)


# --- Against a per-block reference --------------------------------------------------


class BlockPool:
    """vLLM's block pool, one block at a time: a free queue of cached blocks (head is
    evicted first) and blocks with no content, which an allocation takes first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.by_key: dict[int, int] = {}
        self.key_of: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.free_queue: OrderedDict[int, None] = OrderedDict()
        self.raw = 0
        self.next_id = 0

    @property
    def used(self) -> int:
        return self.raw + sum(1 for b in self.key_of if self.refs[b] > 0)

    def match(self, k: NDArray[np.uint64], limit: int) -> list[int]:
        out = []
        for key in k[:limit].tolist():
            if key not in self.by_key:
                break
            out.append(self.by_key[key])
        return out

    def ref(self, block: int) -> None:
        if self.refs[block] == 0:
            del self.free_queue[block]
        self.refs[block] += 1

    def grow(self, n: int) -> bool:
        if n > self.capacity - self.used:
            return False
        empty = self.capacity - self.raw - len(self.key_of)
        for _ in range(max(n - empty, 0)):
            block, _ = self.free_queue.popitem(last=False)
            del self.by_key[self.key_of.pop(block)]
            del self.refs[block]
        self.raw += n
        return True


class RefRequest:
    def __init__(self) -> None:
        self.blocks: list[int] = []  # its cached path, in order
        self.raw = 0
        self.logical = 0


def ref_commit(pool: BlockPool, req: RefRequest, k: NDArray[np.uint64], full: int) -> None:
    for i in range(len(req.blocks), min(full, len(k))):
        key = int(k[i])
        if key in pool.by_key:  # computed elsewhere meanwhile: hold that copy
            pool.ref(pool.by_key[key])
            req.blocks.append(pool.by_key[key])
            continue
        block, pool.next_id = pool.next_id, pool.next_id + 1
        pool.by_key[key], pool.key_of[block], pool.refs[block] = block, key, 1
        req.blocks.append(block)
        req.raw -= 1
        pool.raw -= 1


def ref_release(pool: BlockPool, req: RefRequest) -> None:
    for block in reversed(req.blocks):
        pool.refs[block] -= 1
        if pool.refs[block] == 0:
            pool.free_queue[block] = None
    pool.raw -= req.raw


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_runs_behave_like_blocks_in_a_free_queue(seed: int) -> None:
    rng = np.random.default_rng(seed)
    block, capacity = 4, 40
    # Sequences that share prefixes: 3 trunks, branches off them at random points.
    trunks = [rng.integers(0, 50, 120).astype(np.uint32) for _ in range(3)]
    seqs = []
    for _ in range(12):
        trunk = trunks[int(rng.integers(3))]
        cut = int(rng.integers(0, 100))
        seqs.append(np.concatenate([trunk[:cut], rng.integers(50, 99, 60).astype(np.uint32)]))
    chains = [KeyChain.of(s, block).keys for s in seqs]
    cache, pool = KVCache(capacity, block), BlockPool(capacity)
    live: list[tuple[KVHold, RefRequest, NDArray[np.uint64], int]] = []
    for _ in range(80):
        op = rng.integers(3)
        if op == 0 or not live:  # admit a request for a prefix of one sequence
            k = chains[int(rng.integers(len(chains)))]
            tokens = int(rng.integers(1, 60))
            limit = (tokens - 1) // block
            m = cache.match(k, limit)
            ref_hit = pool.match(k, limit)
            assert m.blocks == len(ref_hit)
            need = cache.blocks_for(tokens) - m.blocks
            if need > cache.available_blocks - m.free_blocks:
                continue
            hold, req = cache.new_hold(), RefRequest()
            cache.acquire(hold, m)
            for b in ref_hit:
                pool.ref(b)
            req.blocks, req.logical = list(ref_hit), len(ref_hit)
            assert cache.grow(hold, need) and pool.grow(need)
            req.raw += need
            req.logical += need
            done = int(rng.integers(m.blocks, tokens // block + 1))
            cache.commit(hold, k, done)
            ref_commit(pool, req, k, done)
            live.append((hold, req, k, tokens))
        elif op == 1:  # a running request computes more (and may not fit)
            i = int(rng.integers(len(live)))
            hold, req, k, tokens = live[i]
            more = int(rng.integers(1, 12))
            need = cache.blocks_for(tokens + more) - hold.logical
            ok = cache.grow(hold, need)
            assert ok == pool.grow(need) or need <= 0
            if ok and need > 0:
                req.raw += need
                req.logical += need
            if ok:
                tokens += more
                cache.commit(hold, k, tokens // block)
                ref_commit(pool, req, k, tokens // block)
                live[i] = (hold, req, k, tokens)
        else:  # a request finishes (or is preempted)
            hold, req, _k, _t = live.pop(int(rng.integers(len(live))))
            cache.release(hold)
            ref_release(pool, req)
        assert cache.used_blocks == pool.used
        assert cache.cached_blocks == len(pool.key_of)
        for k in chains:
            assert cache.match(k, 100).blocks == len(pool.match(k, 100))
