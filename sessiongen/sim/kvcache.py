"""One replica's KV cache in blocks: vLLM V1's block pool with its prefix cache.

What it models (vLLM ``v1/core/block_pool.py``, ``kv_cache_manager.py``,
``docs/design/prefix_caching.md``):

- a fixed number of blocks of ``block_tokens`` tokens; a running request holds the
  blocks of every token it has scheduled, hit blocks shared with other requests;
- a block is *cached* (findable by its chain key) once it is full and computed; the
  partial last block and blocks whose tokens are unknown are never cached;
- a lookup finds the longest cached prefix; it touches nothing until the request is
  admitted (:meth:`KVCache.acquire`), when the hit blocks leave the free queue;
- a finished or preempted request returns its blocks to the free queue in reverse
  order, so its tail is evicted first; allocation evicts the least recently freed
  cached block. Eviction is therefore leaf-first in the prefix tree: a block is
  freed no earlier than the blocks after it, in the same call or later.

The representation is a prefix tree of *runs* of blocks (a radix tree like SGLang's),
not one object per block, so that a 128k-token prompt (8,000 blocks of 16) costs a few
array comparisons and dictionary operations, not 8,000 of each. A node's blocks share
their holders; a node is split where a hit ends inside it. The free queue's order is
kept as one counter per block: a node with no holders has ``base``, the counter of its
last block (its blocks count up towards its head), and eviction takes the smallest.

Two requests that compute the same prefix at the same time (neither found the other's
blocks at admission) both keep their own copies, as vLLM does; the second copy is
counted but not findable, and is freed uncached. The second request also holds the
first copy (its path goes through it) until it ends, where vLLM would let that copy be
evicted and find the prefix through the second: one extra copy per such prefix.

Another simplification: blocks that hold no cached content (a finished request's
partial last block, second copies) are used before any cached block is evicted; vLLM
takes its free queue strictly in order, so such a block waits behind older cached
ones. The difference is at most a block or so per finished request.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

_NO_KEYS: NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)


def _common(run: NDArray[np.uint64], keys: NDArray[np.uint64], pos: int, n: int) -> int:
    """How many of the first ``n`` keys of ``run`` equal ``keys[pos:]``, from the first.

    Chain keys name whole prefixes (see :mod:`sessiongen.sim.cache`): two chains that
    agree at a block agree at every block before it, so the last key decides a whole
    run, and a mismatch's position is found by bisection, not by comparing thousands
    of keys (a 128k-token prompt is 8,000 blocks).
    """
    if run[n - 1] == keys[pos + n - 1]:
        return n
    lo, hi = 0, n - 1  # the first mismatch is in lo..hi
    while lo < hi:
        mid = (lo + hi) // 2
        if run[mid] == keys[pos + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _Node:
    """A run of cached blocks: consecutive blocks of one chain, with the same holders."""

    __slots__ = ("base", "children", "key0", "keys", "parent", "refs", "start")

    def __init__(
        self, keys: NDArray[np.uint64], start: int, parent: _Node | None, refs: int
    ) -> None:
        self.keys = keys  # a view into some request's key array (or a copy); never written
        self.start = start  # chain position (block index) of the first block
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.key0 = int(keys[0]) if len(keys) else -1
        self.refs = refs
        self.base = -1  # free-queue counter of the last block, while refs == 0

    @property
    def end(self) -> int:
        return self.start + len(self.keys)


class KVHold:
    """The blocks one request holds: a path of cached runs plus uncached blocks."""

    __slots__ = ("cached", "last", "logical", "raw")

    def __init__(self, root: _Node) -> None:
        self.last = root  # the deepest node of the request's cached path
        self.cached = 0  # blocks of its sequence on that path (``last.end``)
        self.raw = 0  # blocks held outside the tree (partial, uncommitted, duplicates)
        self.logical = 0  # blocks of the request's sequence it has (cached or not)


class Match(NamedTuple):
    """A lookup's result: ``blocks`` cached blocks from the start of the sequence.

    A named tuple, not a frozen dataclass: one per admission attempt, and a frozen
    dataclass's ``__init__`` costs a ``object.__setattr__`` per field.
    """

    node: _Node
    used: int  # blocks of ``node`` inside the match (all of them unless it ends inside)
    blocks: int
    free_blocks: int  # matched blocks that sit in the free queue (no holder yet)


class KVCache:
    """One replica's KV blocks: allocation, prefix lookups, LRU eviction, usage."""

    def __init__(self, capacity_blocks: int, block_tokens: int) -> None:
        self.capacity = capacity_blocks
        self.block_tokens = block_tokens
        self._root = _Node(_NO_KEYS, 0, None, refs=1)  # held forever, never evicted
        self._cached = 0  # blocks in the tree
        self._evictable = 0  # blocks in the tree with no holder (in the free queue)
        self._raw = 0  # blocks held outside the tree
        self._heap: list[tuple[int, int, _Node]] = []
        self._tick = 0
        self._seq = itertools.count()
        self.evicted_blocks = 0

    # --- accounting -------------------------------------------------------------------

    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests (what vLLM's KV cache usage counts)."""
        return self._raw + self._cached - self._evictable

    @property
    def available_blocks(self) -> int:
        """Blocks an allocation can get: free ones plus evictable cached ones."""
        return self.capacity - self.used_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks findable by a lookup (held or not)."""
        return self._cached

    @property
    def usage(self) -> float:
        """``vllm:kv_cache_usage_perc``: the held share of all blocks (0..1)."""
        return self.used_blocks / self.capacity if self.capacity else 0.0

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_tokens)

    def new_hold(self) -> KVHold:
        return KVHold(self._root)

    # --- lookups and holding ----------------------------------------------------------

    def match(self, keys: NDArray[np.uint64], limit_blocks: int) -> Match:
        """The longest cached prefix of ``keys[:limit_blocks]`` (touches nothing)."""
        node, pos, free = self._root, 0, 0
        limit = min(limit_blocks, len(keys))
        while pos < limit:
            child = node.children.get(int(keys[pos]))
            if child is None:
                break
            ck = child.keys
            n = min(len(ck), limit - pos)
            used = _common(ck, keys, pos, n)
            if child.refs == 0:
                free += used
            pos += used
            if used < len(ck):
                return Match(child, used, pos, free)
            node = child
        return Match(node, len(node.keys), pos, free)

    def acquire(self, hold: KVHold, match: Match) -> None:
        """Hold the matched blocks (an empty ``hold``): they leave the free queue."""
        node = match.node
        if match.used < len(node.keys):
            node = self._split(node, match.used)
        hold.last = node
        hold.cached = hold.logical = match.blocks
        while node is not self._root:
            self._ref(node)
            assert node.parent is not None
            node = node.parent

    def grow(self, hold: KVHold, blocks: int) -> bool:
        """Allocate ``blocks`` more blocks to ``hold``, evicting cached ones if needed.

        False (and nothing changes) when fewer are available: the caller preempts.
        """
        if blocks <= 0:
            return True
        free = self.capacity - self._raw - self._cached  # never used, or emptied
        if blocks > free:
            if blocks > free + self._evictable:
                return False
            self._evict(blocks - free)
        self._raw += blocks
        hold.raw += blocks
        hold.logical += blocks
        return True

    def commit(self, hold: KVHold, keys: NDArray[np.uint64], full_blocks: int) -> None:
        """Make the first ``full_blocks`` blocks of the request findable (computed, full).

        Blocks without a key (tokens not known to the cache) stay uncached.
        """
        target = min(full_blocks, len(keys))
        if target <= hold.cached:
            return
        node = hold.last
        pos = node.start + len(node.keys)
        while pos < target and node.children:  # the same blocks computed by another meanwhile
            child = node.children.get(int(keys[pos]))
            if child is None:
                break
            n = min(len(child.keys), target - pos)
            used = _common(child.keys, keys, pos, n)
            if used < len(child.keys):
                child = self._split(child, used)
            self._ref(child)  # held like a hit; this request's own copies stay uncached
            node, pos = child, pos + used
        if pos < target:
            if node is not self._root and node.refs == 1 and not node.children:
                node.keys = keys[node.start : target]  # only this request holds it: extend
            else:
                child = _Node(keys[pos:target], pos, node, refs=1)
                node.children[child.key0] = child
                node = child
            moved = target - pos
            hold.raw -= moved
            self._raw -= moved
            self._cached += moved
        hold.last = node
        hold.cached = target

    def release(self, hold: KVHold) -> None:
        """Return all of ``hold``'s blocks to the free queue, tail first; empties it."""
        node = hold.last
        while node is not self._root:
            node.refs -= 1
            if node.refs == 0:
                # A cached run nobody holds keeps its keys, not the request's whole
                # key buffer: a session's own blocks after a shared 128k document
                # are a few dozen keys of a 9,000-key buffer (a planned quarter
                # hour of day128k peaked at 620 MB with views, 400 MB without).
                keys = node.keys
                base = keys.base
                if base is not None and len(base) > 2 * len(keys):
                    node.keys = keys.copy()
                node.base = self._tick
                self._tick += len(node.keys)
                self._evictable += len(node.keys)
                heapq.heappush(self._heap, (node.base, next(self._seq), node))
            assert node.parent is not None
            node = node.parent
        self._raw -= hold.raw
        hold.last, hold.raw, hold.logical, hold.cached = self._root, 0, 0, 0

    def drop_cached(self) -> None:
        """Evict every cached block nobody holds (``/sim/reset``)."""
        self._evict(self._evictable)

    # --- internals --------------------------------------------------------------------

    def _ref(self, node: _Node) -> None:
        if node.refs == 0:
            self._evictable -= len(node.keys)
        node.refs += 1

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node`` after ``at`` blocks; returns the new head, ``node`` keeps the tail.

        ``node`` stays the deeper part so that holders whose path ends there keep it.
        """
        parent = node.parent
        assert parent is not None and 0 < at < len(node.keys)
        head = _Node(node.keys[:at], node.start, parent, node.refs)
        parent.children[head.key0] = head
        node.keys = node.keys[at:]
        node.start += at
        node.key0 = int(node.keys[0])
        node.parent = head
        head.children[node.key0] = node
        if node.refs == 0:  # the head's blocks were freed after the tail's
            head.base = node.base + len(node.keys)
            heapq.heappush(self._heap, (head.base, next(self._seq), head))
        return head

    def _evict(self, blocks: int) -> None:
        """Evict ``blocks`` cached, unheld blocks, least recently freed first.

        Typically one block (a decode crossing into a new block of a full cache): the
        oldest node is trimmed where it sits and its entry replaced, not popped and
        pushed again.
        """
        heap = self._heap
        while blocks > 0:
            base, _seq, node = heap[0]
            size = len(node.keys)
            if node.refs != 0 or node.base != base or not size:
                heapq.heappop(heap)  # stale: held again, trimmed or freed again since
                continue
            assert not node.children, "eviction is leaf-first"
            take = min(blocks, size)
            node.keys = node.keys[: size - take]
            node.base += take
            self._evictable -= take
            self._cached -= take
            self.evicted_blocks += take
            blocks -= take
            if size > take:
                heapq.heapreplace(heap, (node.base, next(self._seq), node))
            else:
                heapq.heappop(heap)
                assert node.parent is not None
                del node.parent.children[node.key0]
                node.parent = None
