"""The shared pool as the replicas' schedulers see it: contents, switch and load link.

Contents: :class:`~sessiongen.sim.cache.SharedPool` (whole chunks, LRU, capacity in
bytes). A request's chunks are stored as its prefill computes them, at the end of each
engine step (LMCache saves after every forward pass), and are found by lookups that
start at or after that step's end.

Bandwidth: every replica loads over one link, served first come, first served. A load
first pays the fixed cost (lookup, allocation), then waits for the link and holds it
for ``bytes / bandwidth``. Why FIFO rather than processor sharing (each of ``k``
concurrent readers at ``bandwidth / k``): both keep the link busy whenever there is
work, so the last of several simultaneous loads ends at the same time, but under FIFO a
load's end is known when it starts, whatever starts later. A step's duration is then
fixed when the step is scheduled, which is what lets one scheduler run on a virtual
clock and in wall time alike; with processor sharing a later load on another replica
would stretch a step already under way. Measurements of concurrent LMCache retrieval
are not published (the research notes found none), so neither model is confirmed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.cache import SharedPool
from sessiongen.sim.timing import Params, pool_fixed_s, pool_transfer_s


class Pool:
    """The shared pool of one set of replicas: LRU contents, on/off, a FIFO load link."""

    def __init__(self, profile: SimProfile, on: bool) -> None:
        self.profile = profile
        self.params = Params(profile)
        self.on = on
        capacity = int(profile.pool_capacity_gib * 2**30)
        self.cache = SharedPool(capacity, profile.pool_chunk_tokens, profile.kv_bytes_per_token)
        self.chunk_tokens = profile.pool_chunk_tokens
        self._link_free_at = float("-inf")
        self.loads = 0
        self.link_wait_s = 0.0  # total time loads waited for the link (modeled)

    def lookup(self, keys: Sequence[int], limit_tokens: int, now: float, beyond: int = 0) -> int:
        """Tokens of the longest chunk-aligned prefix stored by ``now`` (0 when off).

        Also 0 when no such prefix can be longer than ``beyond`` tokens (a local hit
        that covers every whole chunk up to the limit): a lookup touches nothing, so
        skipping it changes nothing, and the replica's own cache usually covers
        all but a session's new question.
        """
        if not self.on or limit_tokens // self.chunk_tokens * self.chunk_tokens <= beyond:
            return 0
        return self.cache.lookup(keys, limit_tokens, now)

    def load(self, now: float, tokens: int) -> float:
        """Start loading ``tokens`` tokens at ``now``; returns when the load completes."""
        ready = now + pool_fixed_s(self.params)
        begin = max(ready, self._link_free_at)
        self.link_wait_s += begin - ready
        self._link_free_at = begin + pool_transfer_s(self.params, tokens)
        self.loads += 1
        return self._link_free_at

    def store(self, keys: Sequence[int], visible_at: float) -> None:
        """Store (or refresh) a prompt's first chunks, findable from ``visible_at``."""
        if self.on:
            self.cache.insert(keys, visible_at)

    def clear(self) -> None:
        self.cache.clear()
