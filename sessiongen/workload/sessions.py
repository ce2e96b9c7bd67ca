"""A scenario's sessions for one run salt: what replay sends and the planner prepares.

The :class:`SessionBuilder` takes its sessions from one source (:mod:`.source`, picked
by ``sessions.source``): written from the scenario (:mod:`.synthetic`), a trace's
(:mod:`.tracesource`), or a conversation dataset's (:mod:`.chatsource`). Each
:class:`Session` builds its texts once, on first use, and makes each turn's
:class:`~.requests.TurnRequest` from them; warm-ups are requests of distinct content,
the same whatever the source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from sessiongen.scenario.spec import Scenario
from sessiongen.text.tokenize import Tokenizer
from sessiongen.workload.chatsource import ChatSource
from sessiongen.workload.requests import (
    Blob,
    Piece,
    Texts,
    TurnRequest,
    marker,
    physical_memory,
    request_body,
)
from sessiongen.workload.sharegptsessions import ChatSession
from sessiongen.workload.source import Source
from sessiongen.workload.synthetic import SyntheticSource, warmup_request
from sessiongen.workload.textgen import TextGenerator, generator_for
from sessiongen.workload.tracesessions import TraceSession
from sessiongen.workload.tracesource import TraceSource

__all__ = [
    "Blob",
    "Piece",
    "Session",
    "SessionBuilder",
    "TurnRequest",
    "marker",
    "physical_memory",
    "request_body",
    "source_for",
]

#: Each source by its ``sessions.source`` name.
SOURCES: dict[str, Callable[[Scenario, str, TextGenerator], Source]] = {
    "synthetic": SyntheticSource,
    "trace": TraceSource,
    "sharegpt": ChatSource,
}


def source_for(scenario: Scenario, salt: str, generator: TextGenerator) -> Source:
    """The source of ``scenario``'s sessions, its input read and checked."""
    return SOURCES[scenario.sessions.source](scenario, salt, generator)


@dataclass(slots=True)
class Session:
    """One session's plan; its texts are built on first use and then kept."""

    builder: SessionBuilder
    index: int
    session_id: str
    context_tokens: int
    trace: TraceSession | None = None  # a trace scenario's session: its turns and times
    chat: ChatSession | None = None  # a conversation dataset's session: its turns
    n_turns: int = 0
    _parts: Texts | None = field(default=None, repr=False)

    @property
    def turns(self) -> int:
        return self.n_turns

    def pauses(self) -> list[float]:
        """Modeled seconds before each turn, after the previous answer (turn 1: 0)."""
        return self.builder.source.pauses(self)

    def home_key(self, turn: int) -> int:
        """The index client placements pick turn ``turn``'s replica by
        (:mod:`sessiongen.design.placement`)."""
        return self.builder.source.home_key(self, turn)

    def texts(self) -> Texts:
        """The session's texts (system, context, questions, answers, expected), built once."""
        if self._parts is None:
            self._parts = self.builder.source.texts(self)
        return self._parts

    def forget(self) -> None:
        """Drop the built texts (they are rebuilt, identical, on next use)."""
        self._parts = None

    def request(self, turn: int, answers: Sequence[str] | None = None) -> TurnRequest:
        """Turn ``turn`` (1-based). ``answers``: the real answers so far, which the live
        history mode sends back (the other modes send their own, or none)."""
        if not 1 <= turn <= self.turns:
            raise ValueError(f"turn {turn} outside 1..{self.turns}")
        return self.builder.source.request(self, turn, self.texts(), answers)

    def requests(self) -> Iterator[TurnRequest]:
        """Every turn in order (frozen and none modes)."""
        for turn in range(1, self.turns + 1):
            yield self.request(turn)


class SessionBuilder:
    """Builds a scenario's sessions for one run salt."""

    def __init__(
        self, scenario: Scenario, salt: str, generator: TextGenerator | None = None
    ) -> None:
        self.scenario = scenario
        self.salt = salt
        self.generator = generator or generator_for(scenario.model.tokenizer)
        self.source = source_for(scenario, salt, self.generator)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.generator.tokenizer

    def identity(self) -> dict[str, str]:
        """Tokenizer and text-generator identity for the manifest."""
        return {"tokenizer": self.tokenizer.identity, "text_generator": self.generator.identity}

    def text_bytes(self) -> int:
        """About how much memory the texts of all sessions take while a block runs."""
        return self.source.text_bytes()

    def sessions(self) -> list[Session]:
        """All sessions, indexed globally in their source's order."""
        return [
            Session(self, i, p.session_id, p.context_tokens, p.trace, p.chat, p.turns)
            for i, p in enumerate(self.source.planned())
        ]

    def build_parts(self, session: Session) -> Texts:
        """One session's texts (:meth:`Session.texts` keeps them)."""
        return self.source.texts(session)

    def starts(self, level: float | None) -> list[float] | None:
        """Each session's scheduled start (modeled seconds from the block's start, by
        session index) at load ``level``, or None for a closed loop: a trace's first
        timestamps, else the open-loop schedule (:func:`~.arrivals.arrival_offsets`)."""
        return self.source.starts(level)

    def warmup(self, key: str, tokens: int = 256) -> TurnRequest:
        """A request of distinct content (nothing shared with any session), ``tokens`` long."""
        return warmup_request(self.scenario, self.generator, self.salt, key, tokens)
