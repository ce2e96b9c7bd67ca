"""``[sessions.trace]``: the Mooncake-style trace a scenario takes its requests from.

``sessions.source = "trace"`` names the trace instead of the synthetic session builder::

    [sessions]
    source = "trace"

    [sessions.trace]
    file = "traces/chat-sessions.jsonl"   # relative: the working dir, else beside the scenario
    block_tokens = 512                    # tokens per hash id (Mooncake's)
    speedup = 1.0                         # times and delays divided by it
    limit = 1000                          # at most this many requests
    window_ms = [0, 600000]               # a length from the first request, or [start, end]
    placement_key = "session"             # or "prefix": what client placements key on

``placement_key`` says what the client's own placements (``alternate``, ``fixed``,
``random``, ``move-at:K``) treat as "the session" when they pick a replica: ``session``
(the default) keys on the request's session (its index in the replay; a line without
``session_id`` is a one-turn session of its own), so ``fixed`` keeps a session on one
replica; ``prefix`` keys on the request's prefix root (its first hash id), so ``fixed``
sends every request that starts with the same block to the same replica, the
client-side twin of a prefix-aware router, for traces without sessions.

This module is pure data (the reader is :mod:`sessiongen.workload.trace`), so the
scenario schema embeds it without importing the workload. The file's lines are checked
when the trace is read, not at load: a million-line trace should not be read twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sessiongen.scenario.schema import spec


@dataclass(frozen=True)
class TraceSpec:
    """Where the trace is and which part of it to replay, how fast."""

    file: str = spec("", doc="Mooncake-style JSONL trace (needed for sessions.source = trace)")
    block_tokens: int = spec(512, ge=1, le=1_000_000, doc="tokens per hash id")
    speedup: float = spec(1.0, gt=0, le=1_000_000, doc="arrivals and delays divided by it")
    limit: int | None = spec(None, ge=1, doc="at most this many requests (none: all)")
    window_ms: tuple[float, ...] = spec(
        (),
        ge=0,
        one_or_many=True,
        empty="the whole trace",
        doc="a length in ms from the first request, or [start, end] trace ms (end excluded)",
    )

    placement_key: Literal["session", "prefix"] = spec(
        "session",
        doc="client placements key on: session (a session's index) | prefix (the first hash id)",
    )

    def __post_init__(self) -> None:
        if len(self.window_ms) > 2:
            raise ValueError(
                f"window_ms: expected a length or [start, end], got {len(self.window_ms)} values"
            )
        if len(self.window_ms) == 1 and self.window_ms[0] <= 0:
            raise ValueError(f"window_ms: expected a length > 0, got {self.window_ms[0]:g}")

    def window(self) -> float | tuple[float, float] | None:
        """The window as :func:`sessiongen.workload.trace.read_trace` takes it."""
        if not self.window_ms:
            return None
        if len(self.window_ms) == 1:
            return self.window_ms[0]
        return (self.window_ms[0], self.window_ms[1])

    def path(self, scenario_source: str) -> Path:
        """The trace file: as given if it exists (or is absolute), else beside the scenario."""
        path = Path(self.file)
        if path.is_absolute() or path.exists():
            return path
        beside = Path(scenario_source).parent / path
        return beside if beside.exists() else path


def check_source(source: str, trace: TraceSpec) -> None:
    """``sessions.source = "trace"`` needs ``[sessions.trace] file``."""
    if source == "trace" and not trace.file:
        raise ValueError('trace.file: missing; expected a trace file for source = "trace"')
