"""Chain-hash keys of token blocks, and the shared pool's contents.

Caches key their entries by *chain hashes*: the key of block ``j`` depends on the tokens
of blocks ``0..j``, as in vLLM's prefix cache and LMCache, so a key stands for a whole
prefix and a lookup is the longest run of present keys from the start. Only whole
blocks (chunks) have keys: the tail of a prompt past its last full block is always
recomputed. The replicas' own KV caches are in :mod:`sessiongen.sim.kvcache`.

The pool's eviction is LRU over keys. An insert touches a prompt's keys from last to
first, so the tail of a prefix is older than its head and is evicted first (what vLLM's
free-block queue does); evicting a head block would orphan everything after it.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

# Odd multiplier of the chain (P_j = P_{j-1} * R + d_j mod 2^64) and its inverse.
_R = 0x9E3779B97F4A7C15
_R_INV = pow(_R, -1, 1 << 64)
# Odd multiplier of a block's position, added to its digest before scrambling.
_POSITION = 0xD1B54A32D192ED03
_U64 = np.uint64


def _mix(z: NDArray[Any]) -> NDArray[Any]:
    """splitmix64's finaliser, elementwise on uint64 (a bijection that scrambles bits)."""
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    out: NDArray[Any] = z ^ (z >> _U64(31))
    return out


@functools.cache
def _weights(size: int) -> NDArray[Any]:
    """Fixed random odd weights for the tokens of a block of ``size`` tokens."""
    rng = np.random.default_rng(size)
    return rng.integers(0, 1 << 63, size=size, dtype=np.uint64) * _U64(2) + _U64(1)


@functools.cache
def _powers(base: int, count: int) -> NDArray[Any]:
    """``base**0 .. base**(count-1)`` mod 2^64."""
    out = np.full(count, base, dtype=np.uint64)
    out[0] = 1
    return np.cumprod(out, dtype=np.uint64)


def chain_keys(ids: NDArray[Any], block_tokens: int) -> list[int]:
    """Chain-hash keys of the whole ``block_tokens``-token blocks of ``ids``.

    Vectorised: each block's digest ``d_j`` is a scrambled weighted sum of its tokens plus
    its position (``(j + 1) * P``, ``P`` odd), and the chain ``P_j = sum_k d_k R^(j-k)`` is
    computed as ``R^j * cumsum(d_k R^-k)``. Keys are 64-bit; two different prefixes
    collide with odds of about 2^-64. Returns Python ints (dict keys).

    The position term matters: without it a block whose weighted sum is 0 (all token
    ids 0) scrambles to 0 (splitmix's finaliser maps 0 to 0), and ``[0]`` and ``[0, 0]``
    with one-token blocks got the same key at positions 0 and 1 (found by hypothesis).
    """
    keys: list[int] = KeyChain.of(ids, block_tokens).keys.tolist()
    return keys


class KeyChain:
    """The chain keys of a token sequence, extendable without rehashing its head.

    ``keys`` (uint64) are exactly :func:`chain_keys` of all tokens so far; the running
    sum ``cumsum(d_k R^-k)`` at the last whole block and the tokens past it are kept, so
    :meth:`extend` hashes only the new tokens. A session's next turn (its previous prompt,
    the answer, a new question) or a request's output costs what is new, not the whole
    context again.
    """

    __slots__ = ("_scaled", "_tail", "block_tokens", "keys", "tokens")

    def __init__(
        self,
        block_tokens: int,
        keys: NDArray[np.uint64],
        tokens: int,
        scaled: np.uint64,
        tail: NDArray[np.uint64],
    ) -> None:
        self.block_tokens = block_tokens
        self.keys = keys
        self.tokens = tokens
        self._scaled = scaled
        self._tail = tail

    @classmethod
    def of(cls, ids: Any, block_tokens: int) -> KeyChain:
        """The keys of ``ids`` (any integer sequence)."""
        empty = np.zeros(0, dtype=np.uint64)
        return cls(block_tokens, empty, 0, _U64(0), empty).extend(ids)

    def extend(self, ids: Any) -> KeyChain:
        """The keys of this sequence followed by ``ids`` (this one is unchanged)."""
        new = np.asarray(ids, dtype=np.uint64)
        seq = np.concatenate([self._tail, new]) if len(self._tail) else new
        size, done = self.block_tokens, len(self.keys)
        blocks = len(seq) // size
        if blocks == 0:
            return KeyChain(size, self.keys, self.tokens + len(new), self._scaled, seq)
        with np.errstate(over="ignore"):
            grid = seq[: blocks * size].reshape(blocks, size)
            sums = (grid * _weights(size)).sum(axis=1, dtype=np.uint64)
            positions = np.arange(done + 1, done + blocks + 1, dtype=np.uint64) * _U64(_POSITION)
            digests = _mix(sums + positions)
            # Powers are cached per length; prompts grow turn by turn, so round up.
            length = 1 << (done + blocks - 1).bit_length()
            inverse = _powers(_R_INV, length)[done : done + blocks]
            scaled = self._scaled + np.cumsum(digests * inverse, dtype=np.uint64)
            chain = _mix(scaled * _powers(_R, length)[done : done + blocks])
        keys = np.concatenate([self.keys, chain]) if done else chain
        tail = seq[blocks * size :]
        return KeyChain(size, keys, self.tokens + len(new), _U64(scaled[-1]), tail)


@dataclass(frozen=True)
class PromptKeys:
    """A token sequence's keys at both granularities: vLLM blocks and LMCache chunks."""

    local: KeyChain
    pool: KeyChain

    @classmethod
    def of(cls, ids: Any, block_tokens: int, chunk_tokens: int) -> PromptKeys:
        return cls(KeyChain.of(ids, block_tokens), KeyChain.of(ids, chunk_tokens))

    @property
    def tokens(self) -> int:
        return self.local.tokens

    def extend(self, ids: Any) -> PromptKeys:
        """The keys of this sequence followed by ``ids``."""
        return PromptKeys(self.local.extend(ids), self.pool.extend(ids))


class _LRUKeys:
    """An LRU set of chain-hash keys with a capacity in entries.

    Each key carries the time from which it is visible (the end of the engine step that
    computed it), so that a lookup at an earlier modeled time does not find it even when
    it is processed later (the served simulator schedules a request from its arrival,
    which may lie a little behind the events already processed).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, float] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._keys)

    def prefix_len(self, keys: Sequence[int], now: float = math.inf) -> int:
        """How many of ``keys``, from the first, are visible at ``now`` (no touch)."""
        present = self._keys
        for i, key in enumerate(keys):
            visible_at = present.get(key)
            if visible_at is None or visible_at > now:
                return i
        return len(keys)

    def insert(self, keys: Sequence[int], visible_at: float = -math.inf) -> None:
        """Add or refresh ``keys`` (head most recent), then evict down to capacity."""
        entries = self._keys
        for key in reversed(keys):
            entries[key] = min(entries.get(key, visible_at), visible_at)
            entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        self._keys.clear()


class SharedPool:
    """The shared host-memory pool (LMCache): whole chunks, LRU, capacity in bytes."""

    def __init__(self, capacity_bytes: int, chunk_tokens: int, bytes_per_token: int) -> None:
        self.chunk_tokens = chunk_tokens
        chunk_bytes = chunk_tokens * bytes_per_token
        self._lru = _LRUKeys(max(capacity_bytes // chunk_bytes, 0))

    def keys(self, ids: NDArray[Any]) -> list[int]:
        """The chunk keys of a prompt."""
        return chain_keys(ids, self.chunk_tokens)

    def lookup(self, keys: Sequence[int], max_tokens: int, now: float = math.inf) -> int:
        """Tokens of the longest chunk-aligned prefix stored by ``now``, at most ``max_tokens``."""
        usable = keys[: max(max_tokens, 0) // self.chunk_tokens]
        return self._lru.prefix_len(usable, now) * self.chunk_tokens

    def insert(self, keys: Sequence[int], visible_at: float = -math.inf) -> None:
        """Store a prompt's chunks, found by lookups from ``visible_at`` on (a step's end)."""
        self._lru.insert(keys, visible_at)

    def clear(self) -> None:
        self._lru.clear()

    @property
    def cached_tokens(self) -> int:
        return len(self._lru) * self.chunk_tokens


def split_hit(local_tokens: int, pool_prefix: int) -> tuple[int, int]:
    """(local hit, pool hit) when the pool holds ``pool_prefix`` chunk-aligned tokens.

    The local cache is consulted first; the pool serves only what lies beyond it.
    """
    return local_tokens, max(pool_prefix - local_tokens, 0)
