"""Placement policies: which replica serves turn k of session s.

- ``alternate``: turn k on replica (k - 1 + offset) mod N, with offset = s mod N, so
  sessions start spread over the replicas and every turn after the first moves;
- ``fixed``: every turn of session s on replica s mod N;
- ``random``: each turn on a replica drawn uniformly, seeded by (seed, s, k);
- ``move-at:K``: fixed on s mod N for turns 1..K-1, then on the next replica from turn K.

In ``router:POLICY`` and ``gateway`` placements a router picks the replica instead (see
:mod:`sessiongen.replay.routing`); :func:`replica_for` has no answer for them.
"""

from __future__ import annotations

import hashlib


def replica_for(policy: str, session_index: int, turn: int, n_replicas: int, seed: int = 0) -> int:
    """The replica (0-based) that serves ``turn`` (1-based) of session ``session_index``."""
    if n_replicas < 1:
        raise ValueError("n_replicas must be >= 1")
    home = session_index % n_replicas
    if policy == "alternate":
        return (turn - 1 + home) % n_replicas
    if policy == "fixed":
        return home
    if policy == "random":
        digest = hashlib.blake2b(f"{seed}:{session_index}:{turn}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "little") % n_replicas
    if policy.startswith("move-at:"):
        move_at = int(policy.split(":", 1)[1])
        return home if turn < move_at else (home + 1) % n_replicas
    raise ValueError(f"unknown placement policy {policy!r}")
