"""Token-exact, deterministic multi-turn sessions built from a scenario.

Each session's first user message is a context block of exactly
``initial_context_tokens`` tokens followed by the first question. The block starts
(token 0 onwards) with a marker unique to (run salt, session), so no two sessions and
no two runs with different salts share even their first KV block; everything after the
marker depends only on the scenario seed and the session index, so runs with different
salts stay comparable. Questions and frozen answers are exact to the token too.

History modes (``sessions.history``):

- ``frozen``: turn k+1's messages are turn k's plus a pre-written answer and the next
  question, so every arm sends byte-identical prompts;
- ``live``: the server's real answers are fed back (the driver passes them in);
- ``none``: every turn sends the context with that turn's question only (probe chains).

Trace scenarios (``sessions.source = "trace"``) get their sessions from the trace
instead (:mod:`.tracesessions`): each turn sends its line's whole prompt
(:class:`~.traceprompts.TracePrompts`, exact to the token) with ``max_tokens`` the
line's ``output_length``, and carries the line number and prefix-sharing facts into its
record; the history mode and the probes do not apply to them.

Conversation datasets (``sessions.source = "sharegpt"``) get their sessions from a
ShareGPT-shaped file (:mod:`.sharegptsessions`): each question is a turn, later turns
carry the dataset's answers (frozen) or the model's (live), counts are exact under the
scenario tokenizer; arrivals, think times and placements are the synthetic sessions'.

Needle probes plant facts ("The access code of vault 41 is 9317.") at spread-out
depths of the context; turn k asks for fact k and stores the exact answer beside the
request.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from sessiongen.design.arrivals import arrival_offsets, think_times
from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.text.probes import NEEDLE_FACT, NEEDLE_QUESTION
from sessiongen.text.tokenize import Tokenizer
from sessiongen.workload.reuse import PrefixFacts
from sessiongen.workload.sharegptsessions import (
    ChatSession,
    chat_sessions,
    first_message,
    prompt_tokens,
)
from sessiongen.workload.sharegptsessions import check_context as check_chat_context
from sessiongen.workload.sharegptsessions import messages as chat_messages
from sessiongen.workload.textgen import TextGenerator, generator_for
from sessiongen.workload.traceprompts import TracePrompts
from sessiongen.workload.tracesessions import TraceSession, context_limit, load_sessions

_QUESTION_HEAD = " Question:"
_PLAIN_ASK = "What do you make of this?"


def _seed_of(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def marker(generator: TextGenerator, salt: str, key: str) -> str:
    """The head of a first message: unique to (salt, key), the same length for every key.

    Five single-token words picked by a hash of (salt, key): about 10^17 combinations,
    and since the length never changes, the text after the marker does not depend on
    the salt.
    """
    digest = hashlib.blake2b(f"{salt}\x1f{key}".encode(), digest_size=16).digest()
    pool = generator.one_token_words
    picks = [int.from_bytes(digest[3 * i : 3 * i + 3], "little") % len(pool) for i in range(5)]
    words = generator.units[pool[picks]].tolist()
    return "Ref" + "".join(words) + "."


class Blob:
    """A long text kept once, already JSON-escaped, exactly as a request body carries it.

    A 128k-token context is about 0.5 MB. Keeping it as escaped bytes lets every turn's
    body be sent as parts around it (:meth:`TurnRequest.body_parts`) instead of joining
    a new message string and serializing a new body per request: one copy per session,
    not three per request in flight. JSON string escaping is per character, so the
    escaped parts concatenate to exactly what serializing the joined text gives.
    """

    __slots__ = ("_digest", "json")

    def __init__(self, text: str) -> None:
        self.json = orjson.dumps(text)[1:-1]
        self._digest: bytes | None = None

    def digest(self) -> bytes:
        """A digest of the text, computed once (every turn of a session shares it)."""
        if self._digest is None:
            self._digest = hashlib.blake2b(self.json, digest_size=16).digest()
        return self._digest

    def text(self) -> str:
        """The text back (slow path: generate, tests)."""
        return str(orjson.loads(b'"' + self.json + b'"'))


Piece = str | Blob


def _text(piece: Piece) -> str:
    return piece.text() if isinstance(piece, Blob) else piece


def _escaped(piece: Piece) -> bytes:
    return piece.json if isinstance(piece, Blob) else orjson.dumps(piece)[1:-1]


@dataclass(frozen=True)
class TurnRequest:
    """One request of one session: its messages, exact counts and expected answer.

    Message contents are kept as pieces (long ones as :class:`Blob`), so a request
    holds references to the session's texts rather than copies of them.
    """

    session_id: str
    session_index: int
    turn: int
    context_tokens: int
    content_tokens: int
    expected: str | None
    segments: tuple[tuple[str, tuple[Piece, ...]], ...]  # (role, content pieces)
    max_tokens: int | None = None  # None: the scenario's sessions.max_tokens
    trace_line: int | None = None  # trace requests: the line of the trace
    prefix: PrefixFacts | None = None  # trace requests: what they share with earlier ones
    placement_key: int | None = None  # what client placements key on (None: session_index)

    @property
    def home_key(self) -> int:
        """The index client placements pick the replica by (:mod:`sessiongen.design.placement`)."""
        return self.session_index if self.placement_key is None else self.placement_key

    @property
    def messages(self) -> tuple[tuple[str, str], ...]:
        """(role, content) pairs with each content joined."""
        return tuple((role, "".join(map(_text, pieces))) for role, pieces in self.segments)

    def body(self, scenario: Scenario, *, user: str | None = None) -> dict[str, Any]:
        """The exact request body replay sends for this turn (``user``: the body's
        ``user`` field, which some routers key on)."""
        return request_body(scenario, self.messages, user=user, max_tokens=self.max_tokens)

    def prompt_digest(self) -> str:
        """A digest of the exact prompt: every message's role and content, in order.

        Two requests have the same digest exactly when they send the same messages, so
        their answers are comparable (the salt's marker, live answers and questions all
        change it). Long texts contribute their own cached digest, so this costs
        microseconds per turn, not a pass over the whole context.
        """
        h = hashlib.blake2b(digest_size=8)
        for role, pieces in self.segments:
            h.update(b"\x1e" + role.encode() + b"\x1f")
            for piece in pieces:
                h.update(piece.digest() if isinstance(piece, Blob) else piece.encode())
                h.update(b"\x1d")
        return h.hexdigest()

    def body_parts(self, scenario: Scenario, *, user: str | None = None) -> list[bytes]:
        """The serialized body as parts whose concatenation is ``orjson.dumps(body)``.

        Long texts appear as the session's own escaped bytes, never copied.
        """
        if scenario.model.api == "chat":
            groups = [pieces for _role, pieces in self.segments]
            template = [(role, _SENTINEL % i) for i, (role, _p) in enumerate(self.segments)]
        else:
            groups = [tuple(p for _role, pieces in self.segments for p in pieces)]
            template = [("user", _SENTINEL % 0)]
        raw = orjson.dumps(request_body(scenario, template, user=user, max_tokens=self.max_tokens))
        parts: list[bytes] = []
        pos = 0
        for i, pieces in enumerate(groups):
            mark = (_SENTINEL % i).encode()
            at = raw.index(mark, pos)
            parts.append(raw[pos:at])
            parts.extend(_escaped(p) for p in pieces)
            pos = at + len(mark)
        parts.append(raw[pos:])
        return parts


_SENTINEL = "@@sessiongen-content-%d@@"


def request_body(
    scenario: Scenario,
    messages: Sequence[tuple[str, str]],
    *,
    user: str | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """An OpenAI-compatible streaming request body for ``messages`` (and ``user``);
    ``max_tokens`` by default the scenario's."""
    s = scenario.sampling
    if max_tokens is None:
        max_tokens = scenario.sessions.max_tokens
    body: dict[str, Any] = {"model": scenario.model.name}
    if scenario.model.api == "chat":
        body["messages"] = [{"role": role, "content": content} for role, content in messages]
    else:
        body["prompt"] = "".join(content for _role, content in messages)
    body.update(
        {
            "max_tokens": max_tokens,
            "temperature": s.temperature,
            "seed": s.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    if s.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if scenario.sessions.probe == "equivalence":
        # vLLM extension: logprob tokens as "token_id:N", so digests cover token ids.
        body["return_tokens_as_token_ids"] = True
        if scenario.model.api == "chat":
            body["logprobs"] = True
            body["top_logprobs"] = 1
        else:
            body["logprobs"] = 1
    if user is not None:
        body["user"] = user
    return body


@dataclass
class Session:
    """One session's plan; its texts are built on first use and then kept."""

    builder: SessionBuilder
    index: int
    session_id: str
    context_tokens: int
    trace: TraceSession | None = None  # a trace scenario's session: its turns and times
    chat: ChatSession | None = None  # a conversation dataset's session: its turns
    _parts: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def turns(self) -> int:
        if self.trace is not None:
            return len(self.trace.turns)
        if self.chat is not None:
            return len(self.chat.turns)
        return self.builder.scenario.sessions.turns

    def pauses(self) -> list[float]:
        """Modeled seconds before each turn, after the previous answer (turn 1: 0)."""
        if self.trace is not None:
            return [t.pause_s for t in self.trace.turns]
        sc = self.builder.scenario
        if self.chat is not None:
            return think_times(replace(sc.sessions, turns=self.turns), self.index, sc.seed)
        return think_times(sc.sessions, self.index, sc.seed)

    def texts(self) -> dict[str, Any]:
        """The session's texts (system, context, questions, answers, expected), built once."""
        if not self._parts:
            self._parts = self.builder.build_parts(self)
        return self._parts

    def forget(self) -> None:
        """Drop the built texts (they are rebuilt, identical, on next use)."""
        self._parts = {}

    def request(self, turn: int, answers: Sequence[str] | None = None) -> TurnRequest:
        """Turn ``turn`` (1-based). In live mode ``answers`` are the real answers so far."""
        if not 1 <= turn <= self.turns:
            raise ValueError(f"turn {turn} outside 1..{self.turns}")
        parts = self.texts()
        if self.trace is not None:
            return self._trace_request(turn, parts["prompts"][turn - 1])
        if self.chat is not None:
            return self._chat_request(turn, parts, answers)
        spec = self.builder.scenario.sessions
        msgs: list[tuple[str, tuple[Piece, ...]]] = []
        tokens = 0
        if parts["system"] is not None:
            msgs.append(("system", (parts["system"],)))
            tokens += spec.shared_prefix_tokens
        questions = parts["questions"]
        msgs.append(("user", (parts["context"], questions[0])))
        tokens += self.context_tokens + spec.question_tokens
        if spec.history == "none":
            if turn > 1:
                msgs[-1] = ("user", (parts["context"], questions[turn - 1]))
        else:
            if spec.history == "frozen":
                given = parts["answers"][: turn - 1]
                counts = [spec.answer_tokens] * (turn - 1)
            else:
                given = list(answers or [])
                if len(given) != turn - 1:
                    raise ValueError(f"live turn {turn} needs {turn - 1} answers, got {len(given)}")
                counts = self.builder.generator.count_many(given) if given else []
            for k in range(1, turn):
                msgs.append(("assistant", (given[k - 1],)))
                msgs.append(("user", (questions[k],)))
            tokens += sum(counts) + (turn - 1) * spec.question_tokens
        return TurnRequest(
            session_id=self.session_id,
            session_index=self.index,
            turn=turn,
            context_tokens=self.context_tokens,
            content_tokens=tokens,
            expected=parts["expected"][turn - 1],
            segments=tuple(msgs),
        )

    def home_key(self, turn: int) -> int:
        """The index client placements pick turn ``turn``'s replica by: the session's
        index, or a trace line's first hash id (``sessions.trace.placement_key = "prefix"``)."""
        if self.trace is None or self.builder.scenario.sessions.trace.placement_key != "prefix":
            return self.index
        return self.trace.turns[turn - 1].request.hash_ids[0]

    def _trace_request(self, turn: int, prompt: Blob) -> TurnRequest:
        """A trace turn: its line's whole prompt, its output length, its facts."""
        assert self.trace is not None
        t = self.trace.turns[turn - 1]
        req = t.request
        by_prefix = self.builder.scenario.sessions.trace.placement_key == "prefix"
        return TurnRequest(
            session_id=self.session_id,
            session_index=self.index,
            turn=turn,
            context_tokens=self.context_tokens,
            content_tokens=req.input_length,
            expected=None,
            segments=(("user", (prompt,)),),
            max_tokens=req.output_length,
            trace_line=req.line,
            prefix=t.facts,
            placement_key=req.hash_ids[0] if by_prefix else None,
        )

    def _chat_request(
        self, turn: int, parts: dict[str, Any], answers: Sequence[str] | None
    ) -> TurnRequest:
        """A dataset turn: the first message, then the answers (frozen: the dataset's;
        live: ``answers``) and questions so far; counts exact, max_tokens the turn's."""
        assert self.chat is not None
        sc = self.builder.scenario
        chat_turn = self.chat.turns[turn - 1]
        if sc.sessions.history == "frozen":
            given = parts["answers"][: turn - 1]
            tokens = chat_turn.prompt_tokens
        else:
            given = list(answers or [])
            if len(given) != turn - 1:
                raise ValueError(f"live turn {turn} needs {turn - 1} answers, got {len(given)}")
            tokens = self._live_tokens(turn, parts, given)
        questions = parts["questions"]
        msgs: list[tuple[str, tuple[Piece, ...]]] = []
        if parts["system"] is not None:
            msgs.append(("system", (parts["system"],)))
        msgs.append(("user", (parts["first"],)))
        for k in range(1, turn):
            msgs.append(("assistant", (given[k - 1],)))
            msgs.append(("user", (questions[k],)))
        return TurnRequest(
            session_id=self.session_id,
            session_index=self.index,
            turn=turn,
            context_tokens=self.context_tokens,
            content_tokens=tokens,
            expected=None,
            segments=tuple(msgs),
            max_tokens=chat_turn.max_tokens,
        )

    def _live_tokens(self, turn: int, parts: dict[str, Any], given: Sequence[str]) -> int:
        """A live turn's content tokens: the first turn's, then the real answers' and the
        questions' counts (chat), or the joined prompt's (completions)."""
        assert self.chat is not None
        gen, api = self.builder.generator, self.builder.scenario.model.api
        questions = parts["questions"]
        if api == "chat":
            later = [*given, *questions[1:turn]]
            return self.chat.turns[0].prompt_tokens + sum(gen.count_many(later) if later else [])
        system = parts["system"].text() if parts["system"] is not None else None
        msgs = chat_messages(system, parts["first"].text(), questions, given, turn)
        return prompt_tokens(gen, msgs, api)

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
        self._system: Blob | None = None
        self._trace: list[TraceSession] | None = None
        self._prompts: TracePrompts | None = None
        self._chat: list[ChatSession] | None = None
        self._check()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.generator.tokenizer

    def identity(self) -> dict[str, str]:
        """Tokenizer and text-generator identity for the manifest."""
        return {"tokenizer": self.tokenizer.identity, "text_generator": self.generator.identity}

    def _check(self) -> None:
        spec = self.scenario.sessions
        src = self.scenario.source
        if spec.source == "trace":
            self._check_trace()
            return
        if spec.source == "sharegpt":
            self._check_sharegpt()
            return
        floor = self._question_floor()
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
        need, have = self.text_bytes(), physical_memory()
        if have and need > have // 2:
            raise ScenarioError(
                src,
                "sessions.initial_context_tokens",
                f"the sessions' texts would take about {need / 2**30:.1f} GiB, more than half "
                f"of this machine's {have / 2**30:.1f} GiB; lower sessions.count or the "
                "context sizes",
            )

    def _check_trace(self) -> None:
        """Read the trace (one line naming file, line and field if it is bad) and check
        what a trace replay does not do: its own load schedule, too much memory."""
        sc = self.scenario
        src = sc.source
        # sessions.probe and the other synthetic-only keys: refused at load
        # (sessiongen.scenario.sourcekeys).
        if sc.load.arrival != "closed" or sc.load.levels:
            raise ScenarioError(
                src,
                "load",
                "a trace's arrivals are its timestamps: leave load.arrival and load.levels "
                "out (sessions.trace.speedup scales them)",
            )
        self._trace = load_sessions(sc)
        self._prompts = TracePrompts(
            self.generator,
            seed=sc.seed,
            salt=self.salt,
            block_tokens=sc.sessions.trace.block_tokens,
        )
        need, have = self.text_bytes(), physical_memory()
        if have and need > have // 2:
            raise ScenarioError(
                src,
                "sessions.trace",
                f"the trace's prompts would take about {need / 2**30:.1f} GiB, more than half "
                f"of this machine's {have / 2**30:.1f} GiB; set sessions.trace.limit or window_ms",
            )

    def _check_sharegpt(self) -> None:
        """Read the dataset (one line naming file, conversation and field if it is bad),
        refuse what a dataset replay does not do, check the context and memory."""
        sc = self.scenario
        src, spec = sc.source, sc.sessions
        # sessions.probe, shared_prefix_tokens and the other synthetic-only keys: refused
        # at load (sessiongen.scenario.sourcekeys).
        if spec.history == "none":
            raise ScenarioError(
                src, "sessions.history", 'expected "frozen" or "live" for a conversation dataset'
            )
        self._chat = chat_sessions(
            sc, self.generator, lambda key: marker(self.generator, self.salt, key)
        )
        check_chat_context(self._chat, context_limit(sc), str(spec.sharegpt.path(src)))
        need, have = self.text_bytes(), physical_memory()
        if have and need > have // 2:
            raise ScenarioError(
                src,
                "sessions.sharegpt",
                f"the dataset's prompts would take about {need / 2**30:.1f} GiB, more than half "
                f"of this machine's {have / 2**30:.1f} GiB; set sessions.sharegpt.limit",
            )

    def text_bytes(self) -> int:
        """About how much memory the texts of all sessions take while a block runs.

        Each token is about 4.4 bytes of escaped JSON in English prose (cl100k), kept
        once per session; building one costs about 40 bytes a token for a moment.
        """
        spec = self.scenario.sessions
        if self._trace is not None:
            return int(4.4 * sum(t.request.input_length for s in self._trace for t in s.turns))
        if self._chat is not None:
            last = [c.turns[-1].prompt_tokens for c in self._chat]
            return int(4.4 * sum(last)) + 40 * max(last)
        per_turn = spec.question_tokens + spec.answer_tokens
        per_session = [n + spec.turns * per_turn for n in spec.initial_context_tokens]
        kept = int(4.4 * spec.count * sum(per_session))
        return kept + 40 * max(per_session)

    def _question_floor(self) -> int:
        probe = (
            NEEDLE_QUESTION.format(vault=999) if self.scenario.sessions.probe == "needle" else ""
        )
        return self.generator.count(_QUESTION_HEAD + " " + probe) + 2

    def sessions(self) -> list[Session]:
        """All sessions: ``count`` per initial context size, indexed globally (a trace's:
        in the order of their first lines, ``context_tokens`` 0: a trace has no context
        sizes, so its requests form one group in the analysis)."""
        spec = self.scenario.sessions
        if self._trace is not None:
            return [Session(self, i, t.session_id, 0, trace=t) for i, t in enumerate(self._trace)]
        if self._chat is not None:
            return [
                Session(self, i, c.session_id, c.context_tokens, chat=c)
                for i, c in enumerate(self._chat)
            ]
        out: list[Session] = []
        for n in spec.initial_context_tokens:
            for _ in range(spec.count):
                i = len(out)
                out.append(Session(self, i, f"s{i:04d}-{_label(n)}", n))
        return out

    def starts(self, level: float) -> list[float] | None:
        """Each session's scheduled start (modeled seconds from the block's start, by
        session index) at load ``level``, or None for a closed loop: a trace's first
        timestamps, else the open-loop schedule (:func:`~.arrivals.arrival_offsets`)."""
        if self._trace is not None:
            return [s.start_s for s in self._trace]
        sc = self.scenario
        if sc.load.arrival == "closed":
            return None
        total = sc.sessions.count * len(sc.sessions.initial_context_tokens)
        if self._chat is not None:
            total = len(self._chat)
        return arrival_offsets(sc.load, level, total, sc.seed)

    @property
    def is_trace(self) -> bool:
        """Whether the sessions come from a trace (open loop on its timestamps)."""
        return self._trace is not None

    def system_prompt(self) -> Blob | None:
        """The shared system prompt (one object for all sessions of a run), or None."""
        n = self.scenario.sessions.shared_prefix_tokens
        if n == 0:
            return None
        if self._system is None:
            rng = np.random.default_rng(_seed_of(self.scenario.seed, "system"))
            self._system = Blob(self._exact(marker(self.generator, self.salt, "system"), n, rng))
        return self._system

    def _exact(self, head: str, n_tokens: int, rng: np.random.Generator) -> str:
        gen = self.generator
        body = gen.prose(rng, n_tokens - gen.count(head))
        if gen.exact_by_units:
            return head + body
        return head + gen.fit(body, n_tokens, rng, prefix=head)

    def build_parts(self, session: Session) -> dict[str, Any]:
        """Context, questions, frozen answers and needle answers of one session (a
        trace session's: each turn's whole prompt)."""
        spec = self.scenario.sessions
        if session.trace is not None:
            assert self._prompts is not None
            prompts = self._prompts
            return {"prompts": [Blob(prompts.text(t.request)) for t in session.trace.turns]}
        if session.chat is not None:
            chat = session.chat
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
        rng = np.random.default_rng(_seed_of(self.scenario.seed, session.index))
        head = marker(self.generator, self.salt, session.session_id)
        expected: list[str | None] = [None] * spec.turns
        asks: list[str] = [""] * spec.turns
        if spec.probe == "needle":
            context, expected, asks = self._needle_context(session, head, rng)
        else:
            context = self._exact(head, session.context_tokens, rng)
        questions = [self._question(rng, ask) for ask in asks]
        answers = [self._answer(rng) for _ in range(spec.turns - 1)]
        return {
            "system": self.system_prompt(),
            "context": Blob(context),
            "questions": questions,
            "answers": answers,
            "expected": expected,
        }

    def _needle_context(
        self, session: Session, head: str, rng: np.random.Generator
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

    def _question(self, rng: np.random.Generator, ask: str) -> str:
        """A question of exactly ``question_tokens``: prose lead-in, then the ask."""
        gen = self.generator
        n = self.scenario.sessions.question_tokens
        tail = " " + (ask or _PLAIN_ASK)
        fixed = gen.count(_QUESTION_HEAD) + gen.count(tail)
        lead = gen.prose(rng, n - fixed)
        text = _QUESTION_HEAD + lead + tail
        if gen.exact_by_units:
            return text
        return (
            _QUESTION_HEAD + gen.fit(lead, n - gen.count(tail), rng, prefix=_QUESTION_HEAD) + tail
        )

    def _answer(self, rng: np.random.Generator) -> str:
        n = self.scenario.sessions.answer_tokens
        gen = self.generator
        text = gen.prose(rng, n)
        return text if gen.exact_by_units else gen.fit(text, n, rng)

    def warmup(self, key: str, tokens: int = 256) -> TurnRequest:
        """A request of distinct content (nothing shared with any session), ``tokens`` long."""
        gen = self.generator
        rng = np.random.default_rng(_seed_of(self.scenario.seed, "warmup", key))
        text = self._exact(marker(self.generator, self.salt, f"warmup-{key}"), tokens, rng)
        question = self._question(rng, "")
        return TurnRequest(
            session_id=f"warmup-{key}",
            session_index=-1,
            turn=1,
            context_tokens=tokens,
            content_tokens=tokens + gen.count(question),
            expected=None,
            segments=(("user", (text, question)),),
        )


def physical_memory() -> int:
    """This machine's RAM in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)
