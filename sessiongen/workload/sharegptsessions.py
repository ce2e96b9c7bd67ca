"""A conversation dataset as the replay's sessions: which conversations are kept, each
turn's exact token count and ``max_tokens``, and the texts each turn sends.

The rules (``[sessions.sharegpt]``, conversations read by :mod:`.sharegpt`):

- **Turns.** Each question is a turn. Turn k sends the system prompt (if the dataset
  has one), the first question, and for every earlier turn the dataset's answer and the
  next question: answers are frozen from the dataset (``sessions.history = "frozen"``),
  so every arm and every run sends byte-identical later prompts whatever the model
  said, as the synthetic sessions' frozen answers do. ``history = "live"`` feeds the
  model's own answers back instead (counts then follow the real answers).
- **Apart across runs.** The first message starts with the run's marker
  (:func:`~.requests.marker`: five words from the run salt and the session id): the
  system prompt when there is one (the same for every conversation with the same
  system text, so those share it within a run), else the first question. Runs with
  different salts share no KV block; everything after the marker is the dataset's text.
- **Padding** (``pad_first_to``). The first question is preceded by generated prose
  (:class:`~.textgen.TextGenerator`, seeded by the scenario seed and the session index)
  so that the first turn's prompt is exactly ``pad_first_to`` tokens; a first turn
  already that long is sent as it is.
- **Counts** are the scenario tokenizer's: with ``model.api = "chat"`` a turn's prompt
  is the sum of its messages' counts (a chat server and the simulated pair tokenize each
  message on its own inside the template); with ``"completions"`` the joined prompt is
  counted. ``max_tokens`` is the dataset answer's token count (``output_tokens =
  "answer"``; an unanswered or empty answer falls back to the scenario's), or the
  scenario's for every turn.
- **Kept.** Per conversation, in order: at most ``max_turns`` turns; turns kept while
  prompt + ``max_tokens`` fit ``max_context_tokens`` (the first that does not ends the
  session); the conversation dropped if fewer than ``min_turns`` turns remain. Then at
  most ``limit`` conversations, in file order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.sharegpt import Conversation, read_conversations
from sessiongen.workload.textgen import TextGenerator

_SEP = "\n\n"
_PAD_STREAM = "sharegpt-pad"


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One turn of a dataset session: the question, the frozen answer, exact counts."""

    question: str
    answer: str | None
    prompt_tokens: int  # the turn's prompt content tokens with the frozen answers
    max_tokens: int


@dataclass(frozen=True, slots=True)
class ChatSession:
    """A kept conversation: its id, where it was in the file, its texts' heads, turns."""

    session_id: str
    where: str
    system: str | None  # as sent: the marker, a blank line, the dataset's system text
    head: str  # what the first user message starts with: the marker, or "" after a system
    pad_to: int | None  # tokens of the padded first user message (None: not padded)
    turns: tuple[ChatTurn, ...]

    @property
    def context_tokens(self) -> int:
        """The first turn's prompt tokens when padded (the analysis groups by it), else 0."""
        return self.turns[0].prompt_tokens if self.pad_to is not None else 0


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def first_message(
    gen: TextGenerator, head: str, question: str, pad_to: int | None, *, seed: int, index: int
) -> str:
    """The first user message: the head, the padding (if any), then the first question."""
    if pad_to is None:
        return head + _SEP + question if head else question
    return padded(gen, head, _SEP + question, pad_to, _seed(seed, _PAD_STREAM, index))


def padded(gen: TextGenerator, head: str, tail: str, n_tokens: int, seed: int) -> str:
    """``head`` + generated prose + ``tail``, exactly ``n_tokens`` tokens as a whole.

    The prose is asked for the tokens the head and tail leave. Where a seam merges or
    splits a token (prose ending in ``,`` before a blank line, say) the count can step
    over ``n_tokens``, so prose a token longer and shorter is tried, then the same from
    the next seed of a fixed sequence: the result depends only on the seed and the texts.
    """
    want = n_tokens - gen.count(head) - gen.count(tail)
    for attempt in range(32):
        for size in (want, want + 1, want - 1):
            if size < 1:
                continue
            body = gen.prose(np.random.default_rng([seed, attempt]), size)
            if gen.count(head + body + tail) == n_tokens:
                return head + body + tail
    raise ValueError(f"tokenizer {gen.tokenizer.identity}: could not pad to {n_tokens} tokens")


def messages(
    system: str | None, first: str, questions: Sequence[str], answers: Sequence[str], turn: int
) -> list[tuple[str, str]]:
    """(role, text) of turn ``turn`` (1-based): the system prompt, the first message, then
    for each earlier turn its answer and the next question."""
    out: list[tuple[str, str]] = []
    if system is not None:
        out.append(("system", system))
    out.append(("user", first))
    for k in range(1, turn):
        out.append(("assistant", answers[k - 1]))
        out.append(("user", questions[k]))
    return out


def prompt_tokens(gen: TextGenerator, msgs: Sequence[tuple[str, str]], api: str) -> int:
    """A prompt's content tokens: per message (chat) or the joined text (completions)."""
    if api == "chat":
        return sum(gen.count_many([text for _role, text in msgs]))
    return gen.count("".join(text for _role, text in msgs))


class _Shaper:
    """Turns read conversations into kept sessions with exact counts (module doc)."""

    def __init__(
        self, scenario: Scenario, gen: TextGenerator, marker: Callable[[str], str]
    ) -> None:
        self.scenario = scenario
        self.gen = gen
        self.marker = marker
        self.spec = scenario.sessions.sharegpt
        self.dropped = 0

    def session(self, conv: Conversation, index: int) -> ChatSession | None:
        """The kept session of ``conv`` (the ``index``-th kept), or None when dropped."""
        spec, gen, chat_api = self.spec, self.gen, self.scenario.model.api == "chat"
        exchanges = conv.exchanges[: spec.max_turns]
        session_id = conv.conv_id if conv.conv_id is not None else f"c{index:05d}"
        system = None if conv.system is None else self.marker("system") + _SEP + conv.system
        head = "" if system is not None else self.marker(session_id)
        questions = [e.question for e in exchanges]
        pad_to = None
        if spec.pad_first_to is not None:
            before = gen.count(system) if system is not None and chat_api else 0
            unpadded = (head + _SEP if head else "") + questions[0]
            if gen.count(unpadded) < spec.pad_first_to - before:
                pad_to = spec.pad_first_to - before
        # In chat the padded first message counts exactly pad_to: no need to build it here.
        lazy = pad_to is not None and chat_api
        first = (
            ""
            if lazy
            else first_message(
                gen, head, questions[0], pad_to, seed=self.scenario.seed, index=index
            )
        )
        answers = [e.answer or "" for e in exchanges]
        # One batch of counts per conversation: in chat a turn's prompt is the sum of its
        # messages' counts, so each text is counted once, not once per later turn.
        n = len(exchanges)
        counts = gen.count_many([first, *questions, *answers])
        c_first, c_q, c_a = counts[0], counts[1 : n + 1], counts[n + 1 :]
        base = (gen.count(system) if system is not None else 0) + (pad_to or 0 if lazy else c_first)
        turns: list[ChatTurn] = []
        for k, ex in enumerate(exchanges, start=1):
            if chat_api:
                tokens = base + sum(c_a[j] + c_q[j + 1] for j in range(k - 1))
            else:
                msgs = messages(system, first, questions, answers, k)
                tokens = prompt_tokens(gen, msgs, self.scenario.model.api)
            fallback = self.scenario.sessions.max_tokens
            use_answer = spec.output_tokens == "answer" and ex.answer
            out = max(1, c_a[k - 1]) if use_answer else fallback
            cap = spec.max_context_tokens
            if cap is not None and tokens + out > cap:
                break
            turns.append(ChatTurn(ex.question, ex.answer, tokens, out))
        if len(turns) < spec.min_turns:
            self.dropped += 1
            return None
        return ChatSession(session_id, conv.where, system, head, pad_to, tuple(turns))


def chat_sessions(
    scenario: Scenario, gen: TextGenerator, marker: Callable[[str], str]
) -> list[ChatSession]:
    """The scenario's dataset read and shaped into sessions (module doc); a one-line
    :class:`ScenarioError` when none is kept."""
    spec = scenario.sessions.sharegpt
    path = spec.path(scenario.source)
    shaper = _Shaper(scenario, gen, marker)
    kept: list[ChatSession] = []
    for conv in read_conversations(path):
        chat = shaper.session(conv, len(kept))
        if chat is not None:
            kept.append(chat)
            if len(kept) == spec.limit:
                break
    if not kept:
        cap = spec.max_context_tokens
        within = f" within max_context_tokens = {cap}" if cap is not None else ""
        raise ScenarioError(
            str(path),
            "sessions.sharegpt",
            f"no conversation has min_turns = {spec.min_turns} turns{within} "
            f"({shaper.dropped} dropped)",
        )
    return kept


def check_context(sessions: Sequence[ChatSession], limit: int | None, source: str) -> None:
    """A one-line :class:`ScenarioError` when some turn's prompt plus its ``max_tokens``
    exceeds the model's context length ``limit`` (None: not known, nothing checked)."""
    if limit is None:
        return
    over = [(c, t) for c in sessions for t in c.turns if t.prompt_tokens + t.max_tokens > limit]
    if not over:
        return
    chat, turn = max(over, key=lambda ct: ct[1].prompt_tokens + ct[1].max_tokens)
    raise ScenarioError(
        source,
        "sessions.sharegpt",
        f"{len(over)} turns need more than the model's max_model_len = {limit} tokens "
        f"(prompt + max_tokens); the longest needs {turn.prompt_tokens + turn.max_tokens} "
        f"(conversation {chat.where}); set sessions.sharegpt.max_context_tokens",
    )
