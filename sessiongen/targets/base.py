"""The target protocol: everything replay needs from where its requests go.

Replay never asks which kind of target it has; a new kind is one new module with a
class that satisfies :class:`Target` (and a line in :func:`sessiongen.targets.make_target`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sessiongen.records.format import BlockFacts, KvConnector, TargetInfo


@dataclass(frozen=True)
class ServedBy:
    """How a response names the replica that served it, where it does.

    ``header``: a response header whose value names the replica (the simulator's
    ``x-sim-replica``); ``fingerprint``: the ``system_fingerprint`` of the response's
    final chunk names it (vLLM started with ``--fingerprint-mode custom``). ``names[i]``
    is what replica ``i`` calls itself there; a value that is no replica's name (nor,
    without names, a replica index) names nobody, and the replica stays unknown.
    """

    header: str | None = None
    fingerprint: bool = False
    names: tuple[str, ...] = ()


class Target(Protocol):
    """Where a replay's requests go, one block at a time."""

    kind: str
    simulated: bool
    time_scale: float  # wall seconds per modeled second (1 for real targets)
    n_replicas: int
    # True when every block starts on cold replicas (freshly started, or caches emptied
    # and verified), so that every block may replay the same prompts.
    restarts: bool
    pool_chunk_tokens: int | None  # the shared pool's chunk size, where the target knows it
    served_by: ServedBy  # how its responses name the replica that served them

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        """The design's blocks this target can run (endpoints: only their own arm)."""
        ...

    async def preflight(self) -> None:
        """Fail with a one-line error before any work (an endpoint that is unreachable)."""
        ...

    def attach(self, run_dir: Path) -> None:
        """The run folder: where the target keeps its logs."""
        ...

    def tokenizer_url(self) -> str | None:
        """A replica whose ``/tokenize`` can count tokens before any block opens, if any."""
        ...

    def block_action(self, cache: str) -> str:
        """What opening a block of arm ``cache`` does, in words (``replay --dry-run``)."""
        ...

    async def open_block(self, cache: str) -> list[str]:
        """Make replicas ready for a block in cache arm ``cache``; return their base URLs."""
        ...

    def connectors(self) -> list[KvConnector]:
        """What each replica of the open block said of its KV connector when it opened,
        in URL order (a :class:`~sessiongen.records.format.KvConnector` each: empty where
        it said nothing; an empty list where the target does not ask). Replay stops a
        block whose replicas contradict its arm before sending it."""
        ...

    async def open_gateway(self, placement: str) -> str | None:
        """Where a block of ``placement`` sends every turn: for ``router:POLICY`` a router
        started in front of the open block's replicas, for ``gateway`` the user's
        router; None when the client picks the replica itself."""
        ...

    async def close_block(self, *, next_cache: str | None = None) -> BlockFacts:
        """End a block (stop its router, and its replicas where the target restarts
        them); facts to record. ``next_cache`` is the arm of the block that follows
        (None: none, or unknown), for targets that keep processes for a block of the
        same arm."""
        ...

    def describe(self) -> TargetInfo:
        """The manifest's ``target`` section."""
        ...

    async def close(self) -> None:
        """Release everything (idempotent)."""
        ...
