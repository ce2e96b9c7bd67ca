"""Models of vllm-router's policies for the planner: which replica a routed turn lands on.

These are models of what vllm-router 0.1.17 was measured to do in front of the
simulated pair (``sessiongen.scenario.routerspec``; docs/guides/routers.md),
not its code. Each model sees what the router sees when a request arrives: the
session id (sessiongen sends it in a header), the prompt's KV block keys (for
``cache_aware``, standing in for its character radix tree) and the requests it has
in flight per replica.

- ``round_robin``: one counter over all requests, warm-ups included.
- ``random``: uniform per request, seeded by (scenario seed, block, request number).
- ``power_of_two``: two distinct replicas drawn as ``random``, the one with fewer
  requests in flight (ties: the first drawn).
- ``consistent_hash``: a hash of the session id picks the replica, so a session stays
  put; which replica a given id lands on differs from the router's own hash ring.
- ``sticky_least_loaded``: a new session goes to the replica with the fewest active
  sessions (ties: a hash of the session id), then stays. Sessions stay active until
  the block ends (the router's idle expiry is two hours).
- ``cache_aware``: when load is imbalanced (most in flight minus fewest above 64 and
  above 1.5 times the fewest) the least loaded replica; else the replica whose routed
  prompts share the longest prefix with this one, when that covers more than 30% of
  the prompt; else the least loaded, ties to replica 0. The prefix tree keeps every
  prompt routed in the block (the router's tree is evicted past 2^25 characters
  per replica, more than a block of the shipped scenarios holds).

``kv_aware`` needs vLLM's KV events, which the router reads over ZMQ; it is not modeled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from sessiongen.scenario.routerspec import ROUTER_POLICIES

#: The policies this module models (``router:POLICY`` placements the planner can run).
MODELED = tuple(p for p in ROUTER_POLICIES if p != "kv_aware")

#: cache_aware's defaults, as vllm-router 0.1.17 logs them at start-up.
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5


def _hash(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass
class RouterModel:
    """One block's router: its policy, its state, the replicas' in-flight counts."""

    policy: str
    replicas: int
    seed: int = 0
    in_flight: list[int] = field(default_factory=list)
    _count: int = 0
    _sticky: dict[str, int] = field(default_factory=dict)
    _active: list[int] = field(default_factory=list)
    _trees: list[set[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.policy not in MODELED:
            raise ValueError(f"router policy {self.policy!r} is not modeled")
        self.in_flight = [0] * self.replicas
        self._active = [0] * self.replicas
        self._trees = [set() for _ in range(self.replicas)]

    def route(self, session: str, keys: NDArray[np.uint64]) -> int:
        """The replica for one request of ``session`` with prompt block ``keys``."""
        n = self._count
        self._count += 1
        blocks: list[int] = keys.tolist() if self.policy == "cache_aware" else []
        replica = self._pick(n, session, blocks)
        if self.policy == "cache_aware":
            self._trees[replica].update(blocks)
        self.in_flight[replica] += 1
        return replica

    def finished(self, replica: int) -> None:
        """A request routed to ``replica`` finished."""
        self.in_flight[replica] -= 1

    def _least_loaded(self) -> int:
        return min(range(self.replicas), key=lambda r: (self.in_flight[r], r))

    def _draw(self, n: int, k: int) -> int:
        return _hash(self.seed, "router", n, k) % self.replicas

    def _pick(self, n: int, session: str, keys: Sequence[int]) -> int:
        policy = self.policy
        if policy == "round_robin":
            return n % self.replicas
        if policy == "random":
            return self._draw(n, 0)
        if policy == "power_of_two":
            first = self._draw(n, 0)
            second = (first + 1 + self._draw(n, 1) % max(self.replicas - 1, 1)) % self.replicas
            return second if self.in_flight[second] < self.in_flight[first] else first
        if policy == "consistent_hash":
            return _hash("ring", session) % self.replicas
        if policy == "sticky_least_loaded":
            return self._sticky_pick(session)
        return self._cache_aware(keys)

    def _sticky_pick(self, session: str) -> int:
        found = self._sticky.get(session)
        if found is None:
            found = min(
                range(self.replicas), key=lambda r: (self._active[r], _hash(session, "url", r))
            )
            self._sticky[session] = found
            self._active[found] += 1
        return found

    def _cache_aware(self, keys: Sequence[int]) -> int:
        load = self.in_flight
        low, high = min(load), max(load)
        if high - low > BALANCE_ABS and high > BALANCE_REL * low:
            return self._least_loaded()
        best, matched = 0, -1
        for r, tree in enumerate(self._trees):
            length = _prefix_in(tree, keys)
            if length > matched:
                best, matched = r, length
        if keys and matched / len(keys) > CACHE_THRESHOLD:
            return best
        return self._least_loaded()


def _prefix_in(tree: set[int], keys: Sequence[int]) -> int:
    """How many of ``keys``, from the first, ``tree`` holds. Chain keys stand for whole
    prefixes, so a tree that holds key ``j`` of a prompt holds every key before it, and
    the length is found by bisection."""
    low, high = 0, len(keys)
    while low < high:
        mid = (low + high + 1) // 2
        if keys[mid - 1] in tree:
            low = mid
        else:
            high = mid - 1
    return low
