"""Where a scenario's sessions come from: one small protocol, one module per source.

A :class:`Source` is picked once from ``sessions.source`` (:func:`source_for`, as vLLM's
benchmark datasets are picked by name) and answers everything the session builder asks:

- :mod:`.synthetic`: sessions written from the scenario (context, needles, questions);
- :mod:`.tracesource`: a Mooncake-style trace's sessions, on the trace's own schedule;
- :mod:`.chatsource`: a ShareGPT-shaped conversation dataset's sessions.

Sources check their input when made (one line naming the file and the key), so a
scenario refused on its sessions leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from sessiongen.design.arrivals import arrival_offsets
from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.requests import Texts, TurnRequest, physical_memory
from sessiongen.workload.sharegptsessions import ChatSession
from sessiongen.workload.tracesessions import TraceSession


class SessionKey(Protocol):
    """Which session a source is asked about (:class:`~.sessions.Session`)."""

    @property
    def index(self) -> int: ...
    @property
    def session_id(self) -> str: ...
    @property
    def context_tokens(self) -> int: ...


class Planned(NamedTuple):
    """A session as its source lists it (``trace``, ``chat``: the source's own record).
    A named tuple: a trace lists one per line (a frozen dataclass cost 4x to make)."""

    session_id: str
    context_tokens: int
    turns: int
    trace: TraceSession | None = None
    chat: ChatSession | None = None


class Source(Protocol):
    """What the session builder asks of a source of sessions."""

    def planned(self) -> list[Planned]:
        """Every session, in index order."""
        ...

    def pauses(self, session: SessionKey) -> list[float]:
        """Modeled seconds before each turn, after the previous answer (turn 1's first)."""
        ...

    def home_key(self, session: SessionKey, turn: int) -> int:
        """What client placements pick turn ``turn``'s replica by."""
        ...

    def texts(self, session: SessionKey) -> Texts:
        """The session's texts, built once by the session and kept while it runs."""
        ...

    def request(
        self, session: SessionKey, turn: int, texts: Texts, answers: Sequence[str] | None
    ) -> TurnRequest:
        """Turn ``turn`` (1-based) from the session's texts (live: ``answers`` so far)."""
        ...

    def starts(self, level: float | None) -> list[float] | None:
        """Each session's scheduled start by index at ``level`` (None: a closed loop)."""
        ...

    def text_bytes(self) -> int:
        """About how much memory the sessions' texts take while a block runs."""
        ...


def scheduled(scenario: Scenario, level: float | None, sessions: int) -> list[float] | None:
    """The open-loop schedule of ``sessions`` sessions at ``level`` (None: closed loop;
    only a trace has no level, and its schedule is its own)."""
    if scenario.load.arrival == "closed" or level is None:
        return None
    return arrival_offsets(scenario.load, level, sessions, scenario.seed)


def check_memory(scenario: Scenario, source: Source, key: str, what: str, fix: str) -> None:
    """A :class:`ScenarioError` on ``key`` when ``what`` (the texts) would take more than
    half of this machine's memory (``fix``: what to lower)."""
    need, have = source.text_bytes(), physical_memory()
    if have and need > have // 2:
        raise ScenarioError(
            scenario.source,
            key,
            f"{what} would take about {need / 2**30:.1f} GiB, more than half "
            f"of this machine's {have / 2**30:.1f} GiB; {fix}",
        )
