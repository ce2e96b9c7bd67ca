"""A turn's facts as the experiment knows them, built once by keyword for both drivers.

What was asked (the session, the turn, its content's size and expected answer, the trace
line), where it went and how the schedule placed it (replica, cross-replica, queue, the
session's start, the pause before it). Replay adds what it measured and makes a
:class:`~sessiongen.records.format.RequestRecord`; the planner adds what its engine
modeled and makes a planned row. Times are modeled seconds.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from sessiongen.workload.reuse import PrefixFacts


class Asked(Protocol):
    """What a request says of itself (a workload request, or the planner's turn)."""

    @property
    def session_id(self) -> str: ...
    @property
    def session_index(self) -> int: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def turn(self) -> int: ...
    @property
    def content_tokens(self) -> int: ...
    @property
    def expected(self) -> str | None: ...
    @property
    def trace_line(self) -> int | None: ...
    @property
    def prefix(self) -> PrefixFacts | None: ...


class Placed(NamedTuple):
    """How the script placed one turn (see :meth:`.script.BlockScript.finished`).

    Named tuples, this and :class:`TurnFacts` (immutable and typed as a frozen dataclass
    is): the planner makes one of each per request (12,031 for a Mooncake-shaped hour),
    and a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    2.5 us for TurnFacts against 0.8 us.
    """

    cross_replica: bool | None
    queue_s: float
    arrival_s: float | None
    think_s: float | None


def warmup_placed(hop: int) -> Placed:
    """A warm-up's placement: alone, never queued, outside any session's schedule; its
    second hop (``hop`` 1) reads the prompt on another replica."""
    return Placed(cross_replica=hop > 0, queue_s=0.0, arrival_s=None, think_s=None)


class TurnFacts(NamedTuple):
    """One finished turn as the experiment says it (modeled seconds)."""

    session_id: str
    session_index: int
    context_tokens: int
    turn: int
    content_tokens: int
    expected: str | None
    prompt_digest: str | None
    trace_line: int | None
    trace_shared_blocks: int | None
    trace_shared_tokens: int | None
    trace_reuse_distance: int | None
    replica: int | None
    warmup: bool
    cross_replica: bool | None
    queue_s: float
    arrival_s: float | None
    think_s: float | None

    @classmethod
    def of(
        cls,
        asked: Asked,
        placed: Placed,
        *,
        replica: int | None,
        warmup: bool,
        prompt_digest: str | None,
    ) -> TurnFacts:
        """The facts of ``asked`` as ``placed`` put it on ``replica``."""
        prefix = asked.prefix
        return cls(
            session_id=asked.session_id,
            session_index=asked.session_index,
            context_tokens=asked.context_tokens,
            turn=asked.turn,
            content_tokens=asked.content_tokens,
            expected=asked.expected,
            prompt_digest=prompt_digest,
            trace_line=asked.trace_line,
            trace_shared_blocks=None if prefix is None else prefix.shared_blocks,
            trace_shared_tokens=None if prefix is None else prefix.shared_tokens,
            trace_reuse_distance=None if prefix is None else prefix.reuse_distance,
            replica=replica,
            warmup=warmup,
            cross_replica=placed.cross_replica,
            queue_s=placed.queue_s,
            arrival_s=placed.arrival_s,
            think_s=placed.think_s,
        )
