"""A conversation dataset's sessions (``sessions.source = "sharegpt"``): a ShareGPT-shaped
file's conversations (:mod:`.sharegptsessions`). Each question is a turn; later turns
carry the dataset's answers (frozen) or the model's (live); counts are exact under the
scenario's tokenizer; arrivals, think times and placements are the synthetic sessions'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sessiongen.design.arrivals import think_times
from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.requests import Blob, Piece, Texts, TurnRequest, marker
from sessiongen.workload.sharegptsessions import (
    ChatSession,
    chat_sessions,
    check_context,
    first_message,
    messages,
    prompt_tokens,
)
from sessiongen.workload.source import Planned, SessionKey, check_memory, scheduled
from sessiongen.workload.textgen import TextGenerator
from sessiongen.workload.tracesessions import context_limit


class ChatSource:
    """A conversation dataset's sessions (module doc); read and checked when made."""

    def __init__(self, scenario: Scenario, salt: str, generator: TextGenerator) -> None:
        self.scenario = scenario
        self.generator = generator
        src, spec = scenario.source, scenario.sessions
        # sessions.probe, shared_prefix_tokens and the other synthetic-only keys: refused
        # at load (sessiongen.scenario.sourcekeys).
        if spec.history == "none":
            raise ScenarioError(
                src, "sessions.history", 'expected "frozen" or "live" for a conversation dataset'
            )
        self.sessions: list[ChatSession] = chat_sessions(
            scenario, generator, lambda key: marker(generator, salt, key)
        )
        check_context(self.sessions, context_limit(scenario), str(spec.sharegpt.path(src)))
        fix = "set sessions.sharegpt.limit"
        check_memory(scenario, self, "sessions.sharegpt", "the dataset's prompts", fix)

    def planned(self) -> list[Planned]:
        return [
            Planned(c.session_id, c.context_tokens, len(c.turns), chat=c) for c in self.sessions
        ]

    def pauses(self, session: SessionKey) -> list[float]:
        sc = self.scenario
        turns = len(self.sessions[session.index].turns)
        return think_times(replace(sc.sessions, turns=turns), session.index, sc.seed)

    def home_key(self, session: SessionKey, turn: int) -> int:
        return session.index

    def starts(self, level: float | None) -> list[float] | None:
        return scheduled(self.scenario, level, len(self.sessions))

    def text_bytes(self) -> int:
        last = [c.turns[-1].prompt_tokens for c in self.sessions]
        return int(4.4 * sum(last)) + 40 * max(last)

    def texts(self, session: SessionKey) -> Texts:
        """The first message (padded to its size), the questions and the answers."""
        chat = self.sessions[session.index]
        first = first_message(
            self.generator,
            chat.head,
            chat.turns[0].question,
            chat.pad_to,
            seed=self.scenario.seed,
            index=session.index,
        )
        return {
            "system": Blob(chat.system) if chat.system is not None else None,
            "first": Blob(first),
            "questions": [t.question for t in chat.turns],
            "answers": [t.answer or "" for t in chat.turns],
        }

    def request(
        self,
        session: SessionKey,
        turn: int,
        texts: Texts,
        answers: Sequence[str] | None,
    ) -> TurnRequest:
        """A dataset turn: the first message, then the answers (frozen: the dataset's;
        live: ``answers``) and questions so far; counts exact, max_tokens the turn's."""
        chat_turn = self.sessions[session.index].turns[turn - 1]
        if self.scenario.sessions.history == "frozen":
            given = texts["answers"][: turn - 1]
            tokens = chat_turn.prompt_tokens
        else:
            given = list(answers or [])
            if len(given) != turn - 1:
                raise ValueError(f"live turn {turn} needs {turn - 1} answers, got {len(given)}")
            tokens = self._live_tokens(session, turn, texts, given)
        questions = texts["questions"]
        msgs: list[tuple[str, tuple[Piece, ...]]] = []
        if texts["system"] is not None:
            msgs.append(("system", (texts["system"],)))
        msgs.append(("user", (texts["first"],)))
        for k in range(1, turn):
            msgs.append(("assistant", (given[k - 1],)))
            msgs.append(("user", (questions[k],)))
        return TurnRequest(
            session_id=session.session_id,
            session_index=session.index,
            turn=turn,
            context_tokens=session.context_tokens,
            content_tokens=tokens,
            expected=None,
            segments=tuple(msgs),
            max_tokens=chat_turn.max_tokens,
        )

    def _live_tokens(
        self, session: SessionKey, turn: int, texts: Texts, given: Sequence[str]
    ) -> int:
        """A live turn's content tokens: the first turn's, then the real answers' and the
        questions' counts (chat), or the joined prompt's (completions)."""
        gen, api = self.generator, self.scenario.model.api
        questions = texts["questions"]
        if api == "chat":
            later = [*given, *questions[1:turn]]
            first = self.sessions[session.index].turns[0].prompt_tokens
            return first + sum(gen.count_many(later) if later else [])
        system = texts["system"].text() if texts["system"] is not None else None
        msgs = messages(system, texts["first"].text(), questions, given, turn)
        return prompt_tokens(gen, msgs, api)
