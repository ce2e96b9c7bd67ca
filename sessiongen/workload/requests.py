"""A session's requests as they go on the wire: exact bodies from texts kept once.

- :class:`TurnRequest`: one turn's messages (as pieces), exact counts, expected answer;
  its body (:func:`request_body`) is built, or sent as parts around the session's texts;
- :class:`Blob`: a long text kept once, JSON-escaped, shared by every turn's body;
- :func:`marker`: the head of a first message, unique to (run salt, key), so no two
  sessions and no two runs with different salts share even their first KV block.

Every source of sessions (:mod:`.source`) makes its turns as :class:`TurnRequest`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import orjson

from sessiongen.scenario.spec import Scenario
from sessiongen.workload.reuse import PrefixFacts
from sessiongen.workload.textgen import TextGenerator


def seed_of(*parts: object) -> int:
    """A 64-bit seed from ``parts`` (each text generator draw is seeded by what it makes)."""
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


class Texts(TypedDict, total=False):
    """A session's texts, built once and kept while it runs; each source fills its keys
    (synthetic: system, context, questions, answers, expected; a trace: prompts; a
    dataset: system, first, questions, answers)."""

    system: Blob | None  # the shared system prompt
    context: Blob  # the context block the first question follows
    first: Blob  # a dataset's first message, padded to its size
    questions: list[str]
    answers: list[str]  # frozen answers
    expected: list[str | None]  # needle answers
    prompts: list[Blob]  # a trace's whole prompt per turn


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


def physical_memory() -> int:
    """This machine's RAM in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
