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

import collections
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sessiongen.sim.compiled import hash_kernel, kernel

# Odd multiplier of the chain (P_j = P_{j-1} * R + d_j mod 2^64) and its inverse.
_R = 0x9E3779B97F4A7C15
_R_INV = pow(_R, -1, 1 << 64)
# Odd multiplier of a block's position, added to its digest before scrambling.
_POSITION = 0xD1B54A32D192ED03
_U64 = np.uint64


# As 0-d arrays: numpy combines those with an array faster than its own scalars.
_SHIFTS = tuple(np.array(s, dtype=np.uint64) for s in (30, 27, 31))
_MULTIPLIERS = tuple(np.array(m, dtype=np.uint64) for m in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _mix(z: NDArray[Any]) -> NDArray[Any]:
    """splitmix64's finaliser, elementwise on uint64 (a bijection that scrambles bits).

    In place: ``z`` must be a fresh array the caller owns. A session's turn hashes a
    handful of blocks, where each numpy call's fixed cost is the whole cost, so the
    constants are built once and no temporaries are kept.
    """
    z ^= z >> _SHIFTS[0]
    z *= _MULTIPLIERS[0]
    z ^= z >> _SHIFTS[1]
    z *= _MULTIPLIERS[1]
    z ^= z >> _SHIFTS[2]
    return z


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


@functools.cache
def _positions(count: int) -> NDArray[Any]:
    """The position terms ``(j + 1) * P`` mod 2^64 of blocks ``0 .. count-1``."""
    out: NDArray[Any] = np.arange(1, count + 1, dtype=np.uint64) * _U64(_POSITION)
    return out


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


class _KeyBuffer:
    """Key storage with room to grow, shared by a chain and its extensions.

    Only ``array[:used]`` is ever read, and nothing below ``used`` is ever written again,
    so chains may keep views of it. The room is an eighth, at least 64 keys.
    """

    __slots__ = ("array", "used")

    def __init__(self, keys: int) -> None:
        self.array = np.empty(keys + max(keys // 8, 64), dtype=np.uint64)
        self.used = 0


_NO_KEYS: NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)


def _room(
    prefix: NDArray[np.uint64], buf: _KeyBuffer, own: int, blocks: int
) -> tuple[NDArray[np.uint64], _KeyBuffer, int]:
    """Where ``blocks`` new keys go after a hashed chain's ``own`` keys in ``buf``, as
    (prefix, buffer, own keys in it): that buffer when nothing has appended to it yet
    and it has the room; else a new one, the shared prefix kept and the own keys
    copied, or, with no prefix, everything so far as the prefix and nothing copied."""
    shared = buf.used != own  # another extension appended here first
    if shared and not len(prefix):  # everything so far becomes the prefix: nothing copied
        return buf.array[:own], _KeyBuffer(blocks), 0
    if shared or len(buf.array) < own + blocks:  # keep the prefix, copy the own keys
        grown = _KeyBuffer(own + blocks)
        grown.array[:own] = buf.array[:own]
        return prefix, grown, own
    return prefix, buf, own


class KeyChain:
    """The chain keys of a token sequence, extendable without rehashing its head.

    ``keys`` (uint64) are exactly :func:`chain_keys` of all tokens so far; the running
    sum ``cumsum(d_k R^-k)`` at the last whole block and the tokens past it are kept, so
    :meth:`extend` hashes only the new tokens. A session's next turn (its previous prompt,
    the answer, a new question) or a request's output costs what is new, not the whole
    context again: the keys live in a buffer with spare room that the first extension
    hashed appends to.

    The keys are two pieces, :attr:`segments`: a *prefix* shared with other chains (a
    view, never copied) and the chain's *own* keys in its buffer. A chain extended a
    second time from the same point (a prompt extended by its answer and by the next
    turn's question; a shared document by every session) cannot append where the first
    extension did: the new chain keeps the prefix and copies only the own keys, or, when
    there was no prefix, takes all the keys so far as its prefix and copies nothing. So a
    day of sessions on one 128k document holds the document's keys once, not once a
    turn (each turn copied its 8,000 keys, a quarter of a planned request's time).

    An extension is hashed when its keys are first read, and extending a chain nobody
    has read yet hashes both pieces in one pass: a session's question, extended when
    its answer ends, is hashed together with the next answer when that turn is
    submitted (per piece, numpy's fixed costs are most of a turn's hashing).
    """

    __slots__ = (
        "_buf",
        "_kernel",
        "_last",
        "_own",
        "_pending",
        "_prefix",
        "_scaled",
        "_tail",
        "block_tokens",
        "tokens",
    )

    def __init__(
        self,
        block_tokens: int,
        buf: _KeyBuffer,
        own: int,
        tokens: int,
        scaled: np.uint64,
        tail: NDArray[np.uint64],
        prefix: NDArray[np.uint64] = _NO_KEYS,
    ) -> None:
        self.block_tokens = block_tokens
        self._prefix = prefix
        self._buf = buf
        self._own = own
        self.tokens = tokens
        self._scaled = scaled
        self._tail = tail
        # The compiled hash or None (numpy), chosen when a chain is started and kept
        # by its extensions (asking the environment at every hash cost more than it).
        self._kernel = hash_kernel()
        self._last: tuple[NDArray[np.uint64], KeyChain] | None = None
        # Until this chain is hashed: the hashed chain it extends (its prefix, buffer,
        # own keys, running sum and tail; not the chain itself, whose ``_last`` names
        # this one: a reference cycle would keep every session's keys until a full
        # collection) and the tokens that follow it.
        self._pending: (
            tuple[
                NDArray[np.uint64],
                _KeyBuffer,
                int,
                np.uint64,
                NDArray[np.uint64],
                NDArray[np.uint64],
            ]
            | None
        ) = None

    @classmethod
    def of(cls, ids: Any, block_tokens: int) -> KeyChain:
        """The keys of ``ids`` (any integer sequence), hashed now (the served simulator
        hashes in a worker thread, not on its event loop)."""
        chain = cls(block_tokens, _KeyBuffer(0), 0, 0, _U64(0), _NO_KEYS).extend(ids)
        chain._hash()
        return chain

    @classmethod
    def unique(cls, tokens: int, block_tokens: int, seed: int) -> KeyChain:
        """Keys of ``tokens`` tokens that no other sequence shares, without the tokens.

        For a simulation that needs a context's identity, not its text (a planner
        simulating a day of 128k-token sessions cannot tokenize them): the keys and
        the chain state are drawn from ``seed``, so the result is reproducible and can
        be extended with real tokens like any chain. Two seeds collide with odds of
        about 2^-64 per block.
        """
        rng = np.random.default_rng([seed, block_tokens])
        blocks = tokens // block_tokens
        buf = _KeyBuffer(blocks)
        buf.array[:blocks] = rng.integers(0, 2**64, blocks, dtype=np.uint64, endpoint=False)
        buf.used = blocks
        scaled = _U64(rng.integers(0, 2**64, dtype=np.uint64, endpoint=False))
        tail = rng.integers(0, 2**32, tokens - blocks * block_tokens, dtype=np.uint64)
        return cls(block_tokens, buf, blocks, tokens, scaled, tail)

    @property
    def blocks(self) -> int:
        """How many whole blocks (keys) the sequence has."""
        return self.tokens // self.block_tokens

    @property
    def segments(self) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        """The keys as (prefix, own): read-only views whose concatenation is :attr:`keys`."""
        if self._pending is not None:
            self._hash()
        own: NDArray[np.uint64] = self._buf.array[: self._own]
        return self._prefix, own

    @property
    def keys(self) -> NDArray[np.uint64]:
        """The keys, contiguous (a view when the chain has no prefix, else a new array;
        later extensions never change it)."""
        prefix, own = self.segments
        if not len(prefix):
            return own
        return np.concatenate((prefix, own))

    def extend(self, ids: Any) -> KeyChain:
        """The keys of this sequence followed by ``ids`` (this one is unchanged).

        The last extension is remembered: extending again by the same ids returns it
        (a request's prompt extended by its answer, then again for the next turn).
        """
        new = np.asarray(ids, dtype=np.uint64)
        last = self._last
        if last is not None:
            seen = last[0]
            if seen is new or (len(seen) == len(new) and bool((seen == new).all())):
                return last[1]
        out = KeyChain.__new__(KeyChain)
        out.block_tokens, out.tokens, out._last = self.block_tokens, self.tokens + len(new), None
        out._kernel = self._kernel
        pending = self._pending
        if pending is None:
            out._pending = (self._prefix, self._buf, self._own, self._scaled, self._tail, new)
        else:  # not hashed yet either: hash both pieces at once
            prefix, buf, own, scaled, tail, before = pending
            out._pending = (prefix, buf, own, scaled, tail, np.concatenate((before, new)))
        self._last = (new, out)
        return out

    def trace_memo(self, trace_block: int, after: NDArray[Any]) -> Any | None:
        """The compiled :class:`~sessiongen.sim._core.TraceKeys` for trace prompts that
        extend this chain and end with ``after`` (:meth:`extend_trace`), or None where
        the chain hashes with numpy or ``trace_block`` is not a whole number of this
        chain's blocks (then :meth:`extend` by ``capacity.prompts.trace_prompt``'s ids
        gives the same keys)."""
        memo = kernel("TraceKeys")
        if memo is None or self._kernel is None or trace_block % self.block_tokens:
            return None
        if self._pending is not None:
            self._hash()
        done = len(self._prefix) + self._own
        return memo(np.ascontiguousarray(self._tail), np.asarray(after, dtype=np.uint64),
                    _weights(self.block_tokens), done, int(self._scaled), _R_INV,
                    trace_block)  # fmt: skip

    def extend_trace(self, memo: Any, hash_ids: Sequence[int], length: int) -> KeyChain:
        """:meth:`extend` by a trace prompt's ids and the memo's ``after``
        (``capacity.prompts.trace_prompt(hash_ids, length, trace block, after)``), hashed
        now without making the ids: ``memo`` is :meth:`trace_memo` of this chain, which
        hashes each distinct trace block once for every prompt that has it at the same
        place."""
        if self._pending is not None:
            self._hash()
        if memo.chain != (len(self._prefix) + self._own, int(self._scaled), len(self._tail)):
            raise ValueError("memo: made for another chain (use this chain's trace_memo)")
        added = length + memo.after_tokens
        blocks, kept = divmod(len(self._tail) + added, self.block_tokens)
        prefix, grown, own = _room(self._prefix, self._buf, self._own, blocks)
        tail = np.empty(kept, dtype=np.uint64)
        scaled = memo.keys(hash_ids, length, int(self._scaled), grown.array, own, tail)
        return self._extended(added, prefix, grown, own, blocks, _U64(scaled), tail)

    def extend_unique(self, tokens: int, keys: NDArray[np.uint64]) -> KeyChain:
        """This sequence followed by ``tokens`` tokens that no other sequence has, without
        the tokens (as :meth:`unique` makes a whole chain): ``keys`` are the new whole
        blocks' keys, ``(len(tail) + tokens) // block_tokens`` of them, drawn by the
        caller from a seeded stream of 64-bit values. For an answer nothing will extend
        (a trace's next prompt is its own hash ids): the engine caches its blocks, and
        only their number and their being nobody else's matter; two draws collide with
        odds of about 2^-64 a block. The tail is zeros and the running sum the last key,
        so the chain still extends like any other."""
        if self._pending is not None:
            self._hash()
        blocks, kept = divmod(len(self._tail) + tokens, self.block_tokens)
        if len(keys) != blocks:
            raise ValueError(f"keys: expected {blocks} for {tokens} tokens, got {len(keys)}")
        prefix, grown, own = _room(self._prefix, self._buf, self._own, blocks)
        grown.array[own : own + blocks] = keys
        scaled = keys[-1] if blocks else self._scaled
        tail = np.zeros(kept, dtype=np.uint64)
        return self._extended(tokens, prefix, grown, own, blocks, _U64(scaled), tail)

    def _extended(
        self,
        added: int,
        prefix: NDArray[np.uint64],
        grown: _KeyBuffer,
        own: int,
        blocks: int,
        scaled: np.uint64,
        tail: NDArray[np.uint64],
    ) -> KeyChain:
        """The hashed chain of this one and ``added`` tokens whose ``blocks`` keys were
        written after ``own`` in ``grown``."""
        grown.used = own + blocks
        out = KeyChain.__new__(KeyChain)
        out.block_tokens, out.tokens, out._last = self.block_tokens, self.tokens + added, None
        out._kernel, out._pending = self._kernel, None
        out._prefix, out._buf, out._own = prefix, grown, own + blocks
        out._scaled, out._tail = scaled, tail
        return out

    def _hash(self) -> None:
        """Hash the pending tokens onto the hashed chain they follow."""
        assert self._pending is not None
        prefix, buf, own, base_scaled, base_tail, new = self._pending
        size = self.block_tokens
        blocks = (len(base_tail) + len(new)) // size
        self._pending = None
        if blocks == 0:
            self._prefix, self._buf, self._own = prefix, buf, own
            self._scaled = base_scaled
            # copies, as below: a view would keep the array it was cut from alive
            self._tail = np.concatenate((base_tail, new)) if len(base_tail) else new.copy()
            return
        prefix, buf, own = _room(prefix, buf, own, blocks)
        done = len(prefix) + own  # keys before the new ones: the hash's positions
        end = done + blocks
        out = buf.array[own : own + blocks]
        kernel = self._kernel
        if kernel is not None:  # the same arithmetic, compiled: one call, no temporaries
            # (the tail and the new tokens apart: a 12k-token prompt is not copied)
            new = np.ascontiguousarray(new)
            base_tail = np.ascontiguousarray(base_tail)
            w = _weights(size)
            last = _U64(kernel(base_tail, new, w, int(base_scaled), done, _R_INV, out))
            self._tail = new[blocks * size - len(base_tail) :].copy()
        else:
            seq = np.concatenate((base_tail, new)) if len(base_tail) else new
            # Tables are cached per length; prompts grow turn by turn, so round up.
            length = 1 << (end - 1).bit_length()
            # uint64 arithmetic wraps modulo 2^64 (arrays never warn on overflow).
            digests = seq[: blocks * size].reshape(blocks, size) @ _weights(size)
            digests += _positions(length)[done:end]
            _mix(digests)
            digests *= _powers(_R_INV, length)[done:end]
            scaled = np.add.accumulate(digests)
            scaled += base_scaled
            out[:] = _mix(scaled * _powers(_R, length)[done:end])
            last = scaled[-1]
            self._tail = seq[blocks * size :].copy()
        buf.used = own + blocks
        self._prefix, self._buf, self._own = prefix, buf, own + blocks
        self._scaled = last


class ChunkKeys:
    """A prompt's pool chunk keys read off its block keys, when a chunk is a whole
    number of blocks: chunk ``j`` ends where block ``(j + 1) * per_chunk - 1`` ends, and a
    block's chain key already stands for the whole prefix up to its end, so its key is
    the chunk's key as well (a different number than :func:`chain_keys` at the chunk size
    would give, the same sharing). Nothing is hashed twice: a session's turn hashed
    once at block size costs what one chain costs."""

    __slots__ = ("block_tokens", "local", "per_chunk")

    def __init__(self, local: KeyChain, per_chunk: int) -> None:
        self.local = local
        self.per_chunk = per_chunk
        self.block_tokens = local.block_tokens * per_chunk

    @property
    def tokens(self) -> int:
        return self.local.tokens

    @property
    def blocks(self) -> int:
        return self.local.tokens // self.block_tokens

    @property
    def keys(self) -> NDArray[np.uint64]:
        """Every ``per_chunk``-th block key (the last block of each chunk), gathered from
        the local chain's two segments without joining them."""
        step = self.per_chunk
        prefix, own = self.local.segments
        if not len(prefix):
            view: NDArray[np.uint64] = own[step - 1 :: step]
            return view
        first = -(-(len(prefix) + 1) // step) * step - 1 - len(prefix)  # into own
        return np.concatenate((prefix[step - 1 :: step], own[first::step]))


@dataclass(frozen=True)
class PromptKeys:
    """A token sequence's keys at both granularities: vLLM blocks and LMCache chunks.

    When the chunk size is a whole number of blocks (as the profile's defaults are), the
    chunk keys are read off the block keys (:class:`ChunkKeys`); otherwise they are a
    chain of their own.
    """

    local: KeyChain
    pool: KeyChain | ChunkKeys

    @classmethod
    def of(cls, ids: Any, block_tokens: int, chunk_tokens: int) -> PromptKeys:
        local = KeyChain.of(ids, block_tokens)
        if chunk_tokens % block_tokens == 0:
            return cls(local, ChunkKeys(local, chunk_tokens // block_tokens))
        return cls(local, KeyChain.of(ids, chunk_tokens))

    @classmethod
    def unique(cls, tokens: int, block_tokens: int, chunk_tokens: int, seed: int) -> PromptKeys:
        """Keys of a ``tokens``-token context nobody else shares (:meth:`KeyChain.unique`)."""
        local = KeyChain.unique(tokens, block_tokens, seed)
        if chunk_tokens % block_tokens == 0:
            return cls(local, ChunkKeys(local, chunk_tokens // block_tokens))
        return cls(local, KeyChain.unique(tokens, chunk_tokens, seed))

    @property
    def tokens(self) -> int:
        return self.local.tokens

    def trace_memo(self, trace_block: int, after: NDArray[Any]) -> Any | None:
        """:meth:`KeyChain.trace_memo` of the block chain, where the chunk keys are read
        off it (else None: a chunk chain of its own is extended by ids)."""
        if not isinstance(self.pool, ChunkKeys):
            return None
        return self.local.trace_memo(trace_block, after)

    def extend_trace(self, memo: Any, hash_ids: Sequence[int], length: int) -> PromptKeys:
        """:meth:`KeyChain.extend_trace` (``memo``: :meth:`trace_memo`)."""
        assert isinstance(self.pool, ChunkKeys)
        local = self.local.extend_trace(memo, hash_ids, length)
        return PromptKeys(local, ChunkKeys(local, self.pool.per_chunk))

    def extend(self, ids: Any) -> PromptKeys:
        """The keys of this sequence followed by ``ids``."""
        local = self.local.extend(ids)
        pool = self.pool
        if isinstance(pool, ChunkKeys):
            return PromptKeys(local, ChunkKeys(local, pool.per_chunk))
        return PromptKeys(local, pool.extend(ids))


class _LRUKeys:
    """An LRU set of chain-hash keys with a capacity in entries.

    Each key carries the time from which it is visible (the end of the engine step that
    computed it), so that a lookup at an earlier modeled time does not find it even when
    it is processed later (the served simulator schedules a request from its arrival,
    which may lie a little behind the events already processed).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: collections.OrderedDict[int, float] = collections.OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._keys)

    def prefix_len(self, keys: Sequence[int], now: float = math.inf) -> int:
        """How many of ``keys``, from the first, are visible at ``now`` (no touch).

        At C speed where it can (a 128k prompt is 82 chunks, looked up at every
        admission): an absent key reads as never visible (``inf``), so the prefix ends
        at the first ``inf`` unless a stored key before it is not visible yet.
        """
        if now == math.inf:  # no clock: ``inf`` cannot stand for absent keys
            present = self._keys
            return next((i for i, key in enumerate(keys) if key not in present), len(keys))
        seen = list(map(self._keys.get, keys, itertools.repeat(math.inf)))
        end = seen.index(math.inf) if math.inf in seen else len(seen)
        if end and max(seen[:end]) > now:
            return next(i for i, visible_at in enumerate(seen) if visible_at > now)
        return end

    def insert(self, keys: Sequence[int], visible_at: float = -math.inf) -> None:
        """Add or refresh ``keys`` (head most recent), then evict down to capacity.

        A key already stored keeps the earlier of its two times; in bulk where it can,
        like :meth:`prefix_len`.
        """
        entries = self._keys
        if visible_at == math.inf:
            for key in keys:
                entries.setdefault(key, visible_at)
        else:
            seen = list(map(entries.get, keys, itertools.repeat(math.inf)))
            if seen and max(seen) > visible_at:  # some are absent or stored for later
                for key, at in zip(keys, seen, strict=True):
                    if at > visible_at:
                        entries[key] = visible_at
        # The same order as touching each key in turn, at C speed (a 128k prompt is
        # refreshed whole, 82 chunks, once per request).
        collections.deque(map(entries.move_to_end, reversed(keys)), maxlen=0)
        excess = len(entries) - self.capacity
        if excess > 0:
            pop = entries.popitem
            for _ in range(excess):
                pop(last=False)
            self.evictions += excess

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
