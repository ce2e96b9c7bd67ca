"""A trace's sessions (``sessions.source = "trace"``): the sessions of a Mooncake-style
trace (:mod:`.tracesessions`), each turn its line's whole prompt
(:class:`~.traceprompts.TracePrompts`, exact to the token) with ``max_tokens`` the
line's ``output_length``, carrying the line number and prefix-sharing facts into its
record. First turns start at their timestamps, later turns their delay after the
previous answer; the history mode and the probes do not apply.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.requests import Blob, Texts, TurnRequest
from sessiongen.workload.source import Planned, SessionKey, check_memory
from sessiongen.workload.textgen import TextGenerator
from sessiongen.workload.traceprompts import TracePrompts, check_tokenizer
from sessiongen.workload.tracesessions import TraceSession, load_sessions


class TraceSource:
    """A trace's sessions (module doc); the trace is read and checked when made."""

    def __init__(self, scenario: Scenario, salt: str, generator: TextGenerator) -> None:
        self.scenario = scenario
        src = scenario.source
        # sessions.probe and the other synthetic-only keys: refused at load
        # (sessiongen.scenario.sourcekeys).
        if scenario.load.arrival != "closed" or scenario.load.levels:
            raise ScenarioError(
                src,
                "load",
                "a trace's arrivals are its timestamps: leave load.arrival and load.levels "
                "out (sessions.trace.speedup scales them)",
            )
        self.sessions: list[TraceSession] = load_sessions(scenario)
        check_tokenizer(generator)
        self._generator, self._salt = generator, salt
        fix = "set sessions.trace.limit or window_ms"
        check_memory(scenario, self, "sessions.trace", "the trace's prompts", fix)

    @functools.cached_property
    def prompts(self) -> TracePrompts:
        """The texts of the trace's lines, made when a text is first asked for (a plan
        in shape mode never asks)."""
        block = self.scenario.sessions.trace.block_tokens
        seed = self.scenario.seed
        return TracePrompts(self._generator, seed=seed, salt=self._salt, block_tokens=block)

    def planned(self) -> list[Planned]:
        """The trace's sessions in the order of their first lines (``context_tokens`` 0: a
        trace has no context sizes, so its requests form one group in the analysis)."""
        return [Planned(t.session_id, 0, len(t.turns), trace=t) for t in self.sessions]

    def _of(self, session: SessionKey) -> TraceSession:
        return self.sessions[session.index]

    def pauses(self, session: SessionKey) -> list[float]:
        return [t.pause_s for t in self._of(session).turns]

    def home_key(self, session: SessionKey, turn: int) -> int:
        """The session's index, or its line's first hash id (``placement_key = "prefix"``)."""
        if self.scenario.sessions.trace.placement_key != "prefix":
            return session.index
        return self._of(session).turns[turn - 1].request.hash_ids[0]

    def starts(self, level: float | None) -> list[float]:
        return [s.start_s for s in self.sessions]

    def text_bytes(self) -> int:
        return int(4.4 * sum(t.request.input_length for s in self.sessions for t in s.turns))

    def texts(self, session: SessionKey) -> Texts:
        """Each turn's whole prompt."""
        return {"prompts": [Blob(self.prompts.text(t.request)) for t in self._of(session).turns]}

    def request(
        self,
        session: SessionKey,
        turn: int,
        texts: Texts,
        answers: Sequence[str] | None,
    ) -> TurnRequest:
        """A trace turn: its line's whole prompt, its output length, its facts."""
        t = self._of(session).turns[turn - 1]
        req = t.request
        by_prefix = self.scenario.sessions.trace.placement_key == "prefix"
        return TurnRequest(
            session_id=session.session_id,
            session_index=session.index,
            turn=turn,
            context_tokens=session.context_tokens,
            content_tokens=req.input_length,
            expected=None,
            segments=(("user", (texts["prompts"][turn - 1],)),),
            max_tokens=req.output_length,
            trace_line=req.line,
            prefix=t.facts,
            placement_key=req.hash_ids[0] if by_prefix else None,
        )
