"""Synthetic sessions: token-exact, deterministic multi-turn sessions written from a
scenario (``sessions.source = "synthetic"``, the default).

Each session's first user message is a context block of exactly
``initial_context_tokens`` tokens followed by the first question. The block starts
(token 0 onwards) with a marker unique to (run salt, session)
(:func:`~.requests.marker`); everything after the marker depends only on the scenario
seed and the session index, so runs with different salts stay comparable. Questions and
frozen answers are exact to the token too.

History modes (``sessions.history``):

- ``frozen``: turn k+1's messages are turn k's plus a pre-written answer and the next
  question, so every arm sends byte-identical prompts;
- ``live``: the server's real answers are fed back (the driver passes them in);
- ``none``: every turn sends the context with that turn's question only (probe chains).

Needle probes plant facts ("The access code of vault 41 is 9317.") at spread-out
depths of the context; turn k asks for fact k and stores the exact answer beside the
request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sessiongen.design.arrivals import think_times
from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.text.probes import NEEDLE_FACT, NEEDLE_QUESTION
from sessiongen.workload.requests import Blob, Piece, Texts, TurnRequest, marker, seed_of
from sessiongen.workload.source import Planned, SessionKey, check_memory, scheduled
from sessiongen.workload.textgen import TextGenerator

_QUESTION_HEAD = " Question:"
_PLAIN_ASK = "What do you make of this?"


def exact_text(gen: TextGenerator, head: str, n_tokens: int, rng: np.random.Generator) -> str:
    """``head`` and prose after it, exactly ``n_tokens`` tokens in all."""
    body = gen.prose(rng, n_tokens - gen.count(head))
    if gen.exact_by_units:
        return head + body
    return head + gen.fit(body, n_tokens, rng, prefix=head)


def question_text(gen: TextGenerator, n: int, rng: np.random.Generator, ask: str) -> str:
    """A question of exactly ``n`` tokens: prose lead-in, then the ask."""
    tail = " " + (ask or _PLAIN_ASK)
    fixed = gen.count(_QUESTION_HEAD) + gen.count(tail)
    lead = gen.prose(rng, n - fixed)
    text = _QUESTION_HEAD + lead + tail
    if gen.exact_by_units:
        return text
    return _QUESTION_HEAD + gen.fit(lead, n - gen.count(tail), rng, prefix=_QUESTION_HEAD) + tail


def question_floor(gen: TextGenerator, probe: str) -> int:
    """The fewest tokens a question can have with ``probe``'s ask."""
    ask = NEEDLE_QUESTION.format(vault=999) if probe == "needle" else ""
    return gen.count(_QUESTION_HEAD + " " + ask) + 2


def warmup_request(
    scenario: Scenario, gen: TextGenerator, salt: str, key: str, tokens: int
) -> TurnRequest:
    """A request of distinct content (nothing shared with any session), ``tokens`` long."""
    rng = np.random.default_rng(seed_of(scenario.seed, "warmup", key))
    text = exact_text(gen, marker(gen, salt, f"warmup-{key}"), tokens, rng)
    question = question_text(gen, scenario.sessions.question_tokens, rng, "")
    return TurnRequest(
        session_id=f"warmup-{key}",
        session_index=-1,
        turn=1,
        context_tokens=tokens,
        content_tokens=tokens + gen.count(question),
        expected=None,
        segments=(("user", (text, question)),),
    )


def _label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


class SyntheticSource:
    """Sessions written from the scenario (module doc)."""

    def __init__(self, scenario: Scenario, salt: str, generator: TextGenerator) -> None:
        self.scenario = scenario
        self.salt = salt
        self.generator = generator
        self._system: Blob | None = None
        self._check()

    def _check(self) -> None:
        spec = self.scenario.sessions
        src = self.scenario.source
        floor = question_floor(self.generator, spec.probe)
        if spec.question_tokens < floor:
            raise ScenarioError(
                src, "sessions.question_tokens", f"expected >= {floor} for probe {spec.probe!r}"
            )
        head = self.generator.count(marker(self.generator, self.salt, "x"))
        needles = spec.turns * 16 if spec.probe == "needle" else 0
        for n in spec.initial_context_tokens:
            if n < head + needles + 4:
                raise ScenarioError(
                    src,
                    "sessions.initial_context_tokens",
                    f"expected >= {head + needles + 4} tokens for {spec.turns} turns, got {n}",
                )
        fix = "lower sessions.count or the context sizes"
        check_memory(
            self.scenario, self, "sessions.initial_context_tokens", "the sessions' texts", fix
        )

    def planned(self) -> list[Planned]:
        """``count`` sessions per initial context size, in the sizes' order."""
        spec = self.scenario.sessions
        sizes = [n for n in spec.initial_context_tokens for _ in range(spec.count)]
        return [Planned(f"s{i:04d}-{_label(n)}", n, spec.turns) for i, n in enumerate(sizes)]

    def pauses(self, session: SessionKey) -> list[float]:
        return think_times(self.scenario.sessions, session.index, self.scenario.seed)

    def home_key(self, session: SessionKey, turn: int) -> int:
        return session.index

    def starts(self, level: float | None) -> list[float] | None:
        spec = self.scenario.sessions
        return scheduled(self.scenario, level, spec.count * len(spec.initial_context_tokens))

    def text_bytes(self) -> int:
        """Each token is about 4.4 bytes of escaped JSON in English prose (cl100k), kept
        once per session; building one costs about 40 bytes a token for a moment."""
        spec = self.scenario.sessions
        per_turn = spec.question_tokens + spec.answer_tokens
        per_session = [n + spec.turns * per_turn for n in spec.initial_context_tokens]
        kept = int(4.4 * spec.count * sum(per_session))
        return kept + 40 * max(per_session)

    def system_prompt(self) -> Blob | None:
        """The shared system prompt (one object for all sessions of a run), or None."""
        n = self.scenario.sessions.shared_prefix_tokens
        if n == 0:
            return None
        if self._system is None:
            rng = np.random.default_rng(seed_of(self.scenario.seed, "system"))
            head = marker(self.generator, self.salt, "system")
            self._system = Blob(exact_text(self.generator, head, n, rng))
        return self._system

    def texts(self, session: SessionKey) -> Texts:
        """Context, questions, frozen answers and needle answers of one session."""
        spec = self.scenario.sessions
        gen = self.generator
        rng = np.random.default_rng(seed_of(self.scenario.seed, session.index))
        head = marker(gen, self.salt, session.session_id)
        expected: list[str | None] = [None] * spec.turns
        asks: list[str] = [""] * spec.turns
        if spec.probe == "needle":
            context, expected, asks = self._needle_context(session, head, rng)
        else:
            context = exact_text(gen, head, session.context_tokens, rng)
        questions = [question_text(gen, spec.question_tokens, rng, ask) for ask in asks]
        answers = [self._answer(rng) for _ in range(spec.turns - 1)]
        return {
            "system": self.system_prompt(),
            "context": Blob(context),
            "questions": questions,
            "answers": answers,
            "expected": expected,
        }

    def _needle_context(
        self, session: SessionKey, head: str, rng: np.random.Generator
    ) -> tuple[str, list[str | None], list[str]]:
        spec = self.scenario.sessions
        gen = self.generator
        vaults = rng.choice(np.arange(10, 1000), size=spec.turns, replace=False).tolist()
        codes = rng.integers(1000, 10000, size=spec.turns).tolist()
        facts = [NEEDLE_FACT.format(vault=v, code=c) for v, c in zip(vaults, codes, strict=True)]
        fact_tokens = gen.count_many(facts)
        filler = session.context_tokens - gen.count(head) - sum(fact_tokens)
        # Fact k sits at depth (k + 0.5) / turns of the filler; the order of asking is shuffled
        # so that depth and turn are not confounded.
        cuts = [int(filler * (k + 0.5) / spec.turns) for k in range(spec.turns)]
        pieces = [head]
        prev = 0
        for cut, fact in zip(cuts, facts, strict=True):
            pieces.append(gen.prose(rng, cut - prev) if cut > prev else "")
            pieces.append(fact)
            prev = cut
        pieces.append(gen.prose(rng, filler - prev))
        text = "".join(pieces)
        if not gen.exact_by_units:
            text = head + gen.fit(text[len(head) :], session.context_tokens, rng, prefix=head)
        order = rng.permutation(spec.turns).tolist()
        asks = [NEEDLE_QUESTION.format(vault=vaults[k]) for k in order]
        expected: list[str | None] = [str(codes[k]) for k in order]
        return text, expected, asks

    def _answer(self, rng: np.random.Generator) -> str:
        n = self.scenario.sessions.answer_tokens
        gen = self.generator
        text = gen.prose(rng, n)
        return text if gen.exact_by_units else gen.fit(text, n, rng)

    def request(
        self,
        session: SessionKey,
        turn: int,
        texts: Texts,
        answers: Sequence[str] | None,
    ) -> TurnRequest:
        spec = self.scenario.sessions
        msgs: list[tuple[str, tuple[Piece, ...]]] = []
        tokens = 0
        if texts["system"] is not None:
            msgs.append(("system", (texts["system"],)))
            tokens += spec.shared_prefix_tokens
        questions = texts["questions"]
        msgs.append(("user", (texts["context"], questions[0])))
        tokens += session.context_tokens + spec.question_tokens
        if spec.history == "none":
            if turn > 1:
                msgs[-1] = ("user", (texts["context"], questions[turn - 1]))
        else:
            if spec.history == "frozen":
                given = texts["answers"][: turn - 1]
                counts = [spec.answer_tokens] * (turn - 1)
            else:
                given = list(answers or [])
                if len(given) != turn - 1:
                    raise ValueError(f"live turn {turn} needs {turn - 1} answers, got {len(given)}")
                counts = self.generator.count_many(given) if given else []
            for k in range(1, turn):
                msgs.append(("assistant", (given[k - 1],)))
                msgs.append(("user", (questions[k],)))
            tokens += sum(counts) + (turn - 1) * spec.question_tokens
        return TurnRequest(
            session_id=session.session_id,
            session_index=session.index,
            turn=turn,
            context_tokens=session.context_tokens,
            content_tokens=tokens,
            expected=texts["expected"][turn - 1],
            segments=tuple(msgs),
        )
