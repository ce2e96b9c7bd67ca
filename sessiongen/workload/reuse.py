"""Each trace request's prefix-sharing facts: blocks shared with earlier requests, and how
far back they were last used (the reuse distance, in blocks).

Every hash id of every request is one block reference, in file order and, within a
request, in prompt order. For a reference to a block seen before, its reuse distance is
the number of *distinct other* blocks referenced since that block's previous reference:
Mattson et al.'s LRU stack distance ("Evaluation techniques for storage hierarchies",
IBM Systems Journal 9(2), 1970), so an LRU cache of C blocks holds the block exactly when
the distance is below C. A request's facts are

- ``shared_blocks``: its leading blocks seen in earlier requests (ids are chained, so
  these are the blocks an infinite prefix cache would serve), and their tokens (the last
  block may be partial);
- ``reuse_distance``: the largest distance among those blocks (None when none is
  shared), so an LRU block cache of C blocks serves the whole shared prefix when
  ``reuse_distance < C``.

The distances come from a Fenwick tree over reference times holding a 1 at each block's
latest reference (Bennett and Kruskal's counting idea, "LRU stack processing", IBM J.
Res. Dev. 19(4), 1975): the distance of a reference at time t to a block last used at p
is the count of ones strictly between p and t. That is O(log n) a reference; memory is
one slot per reference and one entry per distinct block, which suits traces of the
Mooncake release's size (tens of thousands of requests), not a million-line stream.

The walk is compiled (``_reuse.pyx``, built by ``pip install`` beside the simulator's
engine) where it was built: the same walk over densified ids, which a planned trace's
read otherwise spends most of its time in (bench/reuse_speed.py). It reads every request
before yielding the first. The Python loop below is the reference, run where the
kernel is missing or older than its source (an editable checkout not rebuilt since
``_reuse.pyx`` changed), under ``SESSIONGEN_ENGINE=python`` (pure Python everywhere, as
for the simulator's engine), or when asked with ``engine="python"``; both give the same
facts (``tests/unit/workload/test_reuse.py``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from sessiongen.infra.extensions import Engine, choose, load_fresh
from sessiongen.workload.trace import TraceRequest

#: Ids below this many times the reference count need no densifying (the walk's table
#: of last uses then has at most that many slots a reference).
_DIRECT = 4


class PrefixFacts(NamedTuple):
    """What one request shares with the requests before it."""

    shared_blocks: int
    shared_tokens: int
    reuse_distance: int | None


class _Fenwick:
    """Prefix sums over positions 1..n of 0/1 marks, growing by doubling."""

    def __init__(self, capacity: int = 1024) -> None:
        self._tree = [0] * (capacity + 1)
        self._marks = bytearray(capacity + 1)

    def _grow(self, need: int) -> None:
        cap = len(self._tree) - 1
        while cap < need:
            cap *= 2
        self._marks.extend(bytes(cap + 1 - len(self._marks)))
        tree = list(self._marks)
        for i in range(1, cap + 1):  # the linear-time build from the marks
            j = i + (i & -i)
            if j <= cap:
                tree[j] += tree[i]
        self._tree = tree

    def set(self, i: int, mark: int) -> None:
        if i >= len(self._tree):
            self._grow(i)
        delta = mark - self._marks[i]
        self._marks[i] = mark
        tree = self._tree
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of marks at positions 1..i."""
        total = 0
        tree = self._tree
        i = min(i, len(tree) - 1)
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    """(the compiled kernel's module or None, why not)."""
    return load_fresh("sessiongen.workload._reuse")


def kernel(engine: Engine = "auto") -> Callable[..., Any] | None:
    """The compiled walk, or None for the Python loop, chosen as every compiled module is
    (:func:`sessiongen.infra.extensions.choose`: ``engine``, or ``SESSIONGEN_ENGINE`` when
    ``auto``)."""
    module = choose(engine, _load(), "the compiled reuse kernel")
    if module is None:
        return None
    walk: Callable[..., Any] = module.prefix_columns
    return walk


def prefix_facts(
    requests: Iterable[TraceRequest],
    block_tokens: int,
    *,
    engine: Engine = "auto",
) -> Iterator[tuple[TraceRequest, PrefixFacts]]:
    """Each request with its :class:`PrefixFacts`, in order (see the module docstring)."""
    walk = kernel(engine)
    if walk is not None:
        kept = list(requests)
        columns = _columns(walk, kept)
        if columns is not None:
            for req, shared, distance in zip(kept, *columns, strict=True):
                tokens = min(shared * block_tokens, req.input_length)
                yield req, PrefixFacts(shared, tokens, None if distance < 0 else distance)
            return
        requests = kept
    yield from _python_facts(requests, block_tokens)


def _columns(
    walk: Callable[..., Any], requests: list[TraceRequest]
) -> tuple[list[int], list[int]] | None:
    """(shared blocks, reuse distance or -1) of each request from the compiled walk;
    None when an id does not fit 64 bits (the Python loop takes any integer)."""
    counts = np.fromiter((len(r.hash_ids) for r in requests), np.int64, len(requests))
    ids = itertools.chain.from_iterable(r.hash_ids for r in requests)
    try:
        flat = np.fromiter(ids, np.int64, int(counts.sum()))
    except OverflowError:
        return None
    if flat.size and (flat.min() < 0 or flat.max() >= _DIRECT * flat.size):
        distinct, dense = np.unique(flat, return_inverse=True)
        flat, blocks = dense.astype(np.int64), len(distinct)
    else:  # small ids index the walk's table as they are (sorting costs it twice over)
        blocks = int(flat.max()) + 1 if flat.size else 0
    shared, distance = walk(flat, counts, blocks)
    return shared.tolist(), distance.tolist()


def _python_facts(
    requests: Iterable[TraceRequest], block_tokens: int
) -> Iterator[tuple[TraceRequest, PrefixFacts]]:
    """The reference walk, one reference at a time over a growing Fenwick tree."""
    last: dict[int, int] = {}
    marks = _Fenwick()
    t = 0
    for req in requests:
        shared = 0
        leading = True
        distance: int | None = None
        for h in req.hash_ids:
            t += 1
            p = last.get(h)
            if p is None:
                leading = False
            else:
                d = marks.prefix(t - 1) - marks.prefix(p)
                marks.set(p, 0)
                if leading:
                    shared += 1
                    distance = d if distance is None else max(distance, d)
            marks.set(t, 1)
            last[h] = t
        tokens = min(shared * block_tokens, req.input_length)
        yield req, PrefixFacts(shared, tokens, distance)
