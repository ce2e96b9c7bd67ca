"""The planner's prompts: every turn of a scenario's sessions and warm-ups as the
served simulator's engine sees it (token counts and block keys), prepared once for every
block of a plan.

Prompts come in two forms (``tokens``):

- ``exact``: every turn's request body is built by the session builder and prepared by
  the served simulator's own code (:meth:`sessiongen.sim.engine.World.prepare`: chat
  template, token ids, block keys, the deterministic answer), so the engine sees what
  the served simulator would;
- ``shape``: for runs too large to tokenize (a day of 128k sessions), each context
  size's first session is prepared exactly and the others get the same token counts
  per turn with keys of their own (:meth:`sessiongen.sim.cache.PromptKeys.unique`):
  a turn extends the previous one as the history mode says (frozen: the previous
  prompt plus new tokens; live: plus the answer's ids too; none: the context plus a
  new question), and no two sessions share a block unless the scenario's shared
  system prompt spans whole blocks.

``auto`` picks ``exact`` up to :data:`EXACT_SESSIONS` sessions per block. A trace
scenario (``sessions.source = "trace"``) runs on the trace's own schedule: first turns at
their timestamps, later turns their delay after the previous answer, as replay sends
them; its records carry the trace line and prefix facts. Its prompts are either
``exact`` (each line's token-exact text from its hash ids, through the chat template and
the tokenizer) or, in ``shape`` mode, token ids made from the hash ids alone
(:func:`block_ids`: block ``h`` is always the same ids, so requests share exactly the
blocks the trace says they share) inside the chat template's own ids, so each prompt
has the exact mode's length and block layout without a text being built or tokenized.
A conversation dataset (``sessions.source = "sharegpt"``) is always ``exact``: its
sessions have texts of their own, so none is a shape for the others.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import orjson
from numpy.typing import NDArray

from sessiongen.scenario.spec import Scenario
from sessiongen.sim.cache import KeyChain, PromptKeys
from sessiongen.sim.compiled import kernel
from sessiongen.sim.engine import Job, World
from sessiongen.workload.reuse import PrefixFacts
from sessiongen.workload.sessions import Session, SessionBuilder, TurnRequest
from sessiongen.workload.textgen import generator_for

Tokens = Literal["auto", "exact", "shape"]

#: ``tokens = "auto"`` prepares every prompt exactly up to this many sessions per block.
EXACT_SESSIONS = 256

#: Seed of the synthetic system prompt every shaped session shares (session seeds are
#: their indexes, far below it).
_HEAD_SEED = 1 << 40


class Turn(NamedTuple):
    """One turn as the engine sees it, and what its record says of the request (a named
    tuple: a planned day builds half a million)."""

    session_id: str
    session_index: int
    context_tokens: int
    turn: int
    prompt: PromptKeys
    output_tokens: int
    output_ids: NDArray[Any] | None
    content_tokens: int
    prompt_digest: str | None
    expected: str | None
    trace_line: int | None = None
    prefix: PrefixFacts | None = None
    # A trace turn in shape mode: the keys of its prompt and answer (the answer's
    # blocks nobody else's, KeyChain.extend_unique), in place of output ids.
    answer: KeyChain | None = None


class Prompts:
    """Turns of sessions and warm-ups, exactly or by shape (see the module doc)."""

    def __init__(self, scenario: Scenario, world: World, salt: str, tokens: Tokens) -> None:
        self.scenario = scenario
        self.world = world
        self.builder = SessionBuilder(scenario, salt, generator_for(scenario.model.tokenizer))
        self.sessions = self.builder.sessions()
        per_block = len(self.sessions)
        self.mode: Literal["exact", "shape"] = (
            ("exact" if per_block <= EXACT_SESSIONS else "shape") if tokens == "auto" else tokens
        )
        self._shapes: dict[int, Shape] = {}
        self._exact: dict[int, list[Turn]] = {}
        self._template: tuple[PromptKeys, NDArray[np.uint32]] | None = None
        # Synthetic token ids (shaped prompts, answers of trace prompts): one seeded
        # stream handed out in the order sessions begin, which is the same in every run
        # of the scenario. A generator per session cost 80 us to seed, more than the
        # session's turns then cost the compiled engine.
        self._ids = _Ids(np.random.default_rng([scenario.seed, 0x5E55]))
        # The keys of a shaped trace prompt's answer blocks: 64-bit draws of their own
        # seeded stream, handed out in the same order.
        self._answer_keys = _Ids(np.random.default_rng([scenario.seed, 0xA45E]), raw=True)

    def prepare(self, req: TurnRequest) -> Job:
        """The served simulator's own preparation of one request body."""
        raw = orjson.dumps(req.body(self.scenario))
        return self.world.prepare(raw, self.scenario.model.api)

    def exact_turns(self, session: Session) -> list[Turn]:
        answers: list[str] = []
        out: list[Turn] = []
        for k in range(1, session.turns + 1):
            req = session.request(k, answers)
            job = self.prepare(req)
            output = job.output or self.world.complete(job, pool_hit=0)[0]
            answers.append(output.text)
            out.append(_turn_of(req, job, np.asarray(output.ids, dtype=np.uint32)))
        session.forget()
        return out

    def turns(self, session: Session) -> list[Turn]:
        """Every turn of ``session``, in order."""
        if self.mode == "exact" or self.scenario.sessions.source == "sharegpt":
            # a dataset's turns have their own texts: no session is a shape for another
            if len(self.sessions) > EXACT_SESSIONS:
                return self.exact_turns(session)
            # Every block replays the same sessions with the same salt: prepared once,
            # not once a block (building and tokenizing the texts is nearly all of a
            # small exact plan's time; load128k's four blocks planned 3.6x faster).
            turns = self._exact.get(session.index)
            if turns is None:
                turns = self._exact[session.index] = self.exact_turns(session)
            return turns
        if session.trace is not None:
            return self._hashed(session)
        shape = self._shapes.get(session.context_tokens)
        if shape is None:
            shape = self._shapes[session.context_tokens] = self._shape_of(session.context_tokens)
        return self._shaped(session, shape)

    def _shape_of(self, context_tokens: int) -> Shape:
        """The first two sessions of a context size, prepared exactly: token counts per
        turn, and how many whole blocks the sessions share (a system prompt) and the
        turns of a session share (the context, with history none)."""
        first, *rest = [s for s in self.sessions if s.context_tokens == context_tokens][:2]
        template = self.exact_turns(first)
        shared = 0
        if rest:
            other = self.exact_turns(rest[0])[0].prompt.local.keys
            shared = _common(template[0].prompt.local.keys, other)
        context = template[0].prompt.local.keys
        if len(template) > 1 and self.scenario.sessions.history == "none":
            context_blocks = _common(context, template[1].prompt.local.keys)
        else:
            context_blocks = len(context)
        p = self.world.profile
        block = p.local_block_tokens
        head = None
        if shared:  # one synthetic system prompt, extended by every session
            head = PromptKeys.unique(shared * block, block, p.pool_chunk_tokens, seed=_HEAD_SEED)
        return Shape(template, head, context_blocks * block)

    def _shaped(self, session: Session, shape: Shape) -> list[Turn]:
        p = self.world.profile
        sizes = (p.local_block_tokens, p.pool_chunk_tokens)
        history = self.scenario.sessions.history
        ids = self._ids
        head = shape.head
        out: list[Turn] = []
        context: PromptKeys | None = None
        for k, model in enumerate(shape.template):
            n = model.prompt.tokens
            if k == 0 or history == "none":
                if context is None:
                    c = shape.context_tokens if history == "none" else n
                    context = (
                        PromptKeys.unique(c, *sizes, seed=session.index)
                        if head is None
                        else head.extend(ids.take(c - head.tokens))
                    )
                prompt = context.extend(ids.take(n - context.tokens))
            else:
                prev = out[-1]
                base = prev.prompt
                if history == "live" and prev.output_ids is not None:
                    base = base.extend(prev.output_ids)
                prompt = base.extend(ids.take(n - base.tokens))
            outputs = ids.take(model.output_tokens)
            out.append(
                Turn(
                    session_id=session.session_id,
                    session_index=session.index,
                    context_tokens=session.context_tokens,
                    turn=model.turn,
                    prompt=prompt,
                    output_tokens=model.output_tokens,
                    output_ids=outputs,
                    content_tokens=model.content_tokens,
                    prompt_digest=None,
                    expected=None,
                )
            )
        return out

    def _chat_template(self) -> tuple[PromptKeys, NDArray[np.uint32]]:
        """The keys of what the chat template puts before a user message's content, and
        the ids it puts after (found by tokenizing an empty and a one-word message)."""
        if self._template is None:
            p = self.world.profile
            if self.scenario.model.api == "chat":
                chat = self.world.tokenizer.chat
                empty, word = chat([("user", "")]), chat([("user", "x")])
                n = int(np.flatnonzero(empty != word[: len(empty)])[0])
                head, tail = empty[:n], empty[n:]
            else:
                head = tail = np.zeros(0, dtype=np.uint32)
            keys = PromptKeys.of(head, p.local_block_tokens, p.pool_chunk_tokens)
            self._template = (keys, tail)
        return self._template

    @functools.cached_property
    def _trace_memo(self) -> Any | None:
        """The compiled memo of the trace's prompts (:meth:`PromptKeys.trace_memo`), or
        None (each prompt then extends the template by its ids)."""
        head, tail = self._chat_template()
        return head.trace_memo(self.scenario.sessions.trace.block_tokens, tail)

    def _hashed(self, session: Session) -> list[Turn]:
        """A trace session's turns with prompts made from their hash ids (module doc)."""
        assert session.trace is not None
        head, tail = self._chat_template()
        spec = self.scenario.sessions.trace
        answer_keys = self._answer_keys
        size = head.local.block_tokens
        memo = self._trace_memo
        out: list[Turn] = []
        for k, t in enumerate(session.trace.turns, start=1):
            req = t.request
            if memo is not None:  # the same keys as extend(trace_prompt(...)), no ids made
                prompt = head.extend_trace(memo, req.hash_ids, req.input_length)
            else:
                prompt = head.extend(
                    trace_prompt(req.hash_ids, req.input_length, spec.block_tokens, tail)
                )
            n = req.output_length
            blocks = (prompt.tokens % size + n) // size
            answer = prompt.local.extend_unique(n, answer_keys.take(blocks))
            out.append(
                Turn(
                    session_id=session.session_id,
                    session_index=session.index,
                    context_tokens=session.context_tokens,
                    turn=k,
                    prompt=prompt,
                    output_tokens=req.output_length,
                    output_ids=None,
                    content_tokens=req.input_length,
                    prompt_digest=None,
                    expected=None,
                    trace_line=req.line,
                    prefix=t.facts,
                    answer=answer,
                )
            )
        return out

    def warmup(self, key: str, tokens: int) -> Turn:
        """A warm-up request, prepared exactly (they are short)."""
        req = self.builder.warmup(key, tokens)
        job = self.prepare(req)
        output = job.output or self.world.complete(job, pool_hit=0)[0]
        return _turn_of(req, job, np.asarray(output.ids, dtype=np.uint32))


@dataclass(frozen=True)
class Shape:
    """What synthetic sessions copy from a context size's first session."""

    template: list[Turn]
    head: PromptKeys | None  # keys of the whole blocks every session shares (system prompt)
    context_tokens: int  # whole blocks every turn of a session shares (history none)


def _common(a: NDArray[Any], b: NDArray[Any]) -> int:
    """How many leading keys two chains share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


#: Odd multiplier that scrambles a block's (hash id, position) into a token id.
_SCRAMBLE = np.uint64(0x9E3779B97F4A7C15)


def block_ids(hash_ids: Sequence[int], input_length: int, block_tokens: int) -> NDArray[np.uint32]:
    """``input_length`` synthetic token ids whose ``block_tokens``-token blocks are named by
    ``hash_ids``: token ``p`` of block ``h`` is a scramble of ``h * block_tokens + p``
    (24 bits), the same in every prompt, so prompts whose first k hash ids agree share
    exactly their first ``k * block_tokens`` ids (the last block cut short), and blocks
    with different ids differ in nearly every position (the scramble is a bijection of
    64 bits, cut to its top 24). No text, no tokenizer: a trace's
    prompts for the planner, which needs only their lengths and block identities."""
    size = np.uint64(block_tokens)
    h = np.asarray(hash_ids, dtype=np.uint64)
    at = np.repeat(h * size, block_tokens)[:input_length]
    at += np.tile(np.arange(block_tokens, dtype=np.uint64), len(h))[:input_length]
    at *= _SCRAMBLE
    at >>= np.uint64(40)
    return at.astype(np.uint32)


def trace_prompt(
    hash_ids: Sequence[int], input_length: int, block_tokens: int, after: NDArray[Any]
) -> NDArray[np.uint64]:
    """:func:`block_ids` followed by ``after``, as the uint64 ids the key chain hashes: in
    one pass of the compiled engine's ``trace_tokens`` where it runs (a third of a shaped
    trace prompt's cost went to building its ids), else from :func:`block_ids`."""
    out = np.empty(input_length + len(after), dtype=np.uint64)
    fill = kernel("trace_tokens")
    if fill is not None:
        fill(np.asarray(hash_ids, dtype=np.uint64), input_length, block_tokens, out)
    else:
        out[:input_length] = block_ids(hash_ids, input_length, block_tokens)
    out[input_length:] = after
    return out


class _Ids:
    """Random token ids, drawn many thousand at a time (a draw's fixed cost is most of a
    turn's few hundred ids) and handed out in order."""

    def __init__(
        self, rng: np.random.Generator, batch: int = 1 << 16, *, raw: bool = False
    ) -> None:
        self.rng = rng
        self.batch = batch
        self.raw = raw  # whole 64-bit draws (keys), else token ids below 100,000
        self._ids: NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)
        self._at = 0

    def take(self, n: int) -> NDArray[np.uint64]:
        n = max(n, 0)
        if self._at + n > len(self._ids):
            size = max(n, self.batch)
            self._ids = (
                self.rng.bit_generator.random_raw(size) if self.raw else _ids(self.rng, size)
            )
            self._at = 0
        out = self._ids[self._at : self._at + n]
        self._at += n
        return out


def _ids(rng: np.random.Generator, n: int) -> NDArray[np.uint64]:
    # uint64, the dtype the key chains hash (no conversion per turn)
    return rng.integers(0, 100_000, max(n, 0), dtype=np.uint64)


def _turn_of(req: TurnRequest, job: Job, output_ids: NDArray[Any]) -> Turn:
    return Turn(
        session_id=req.session_id,
        session_index=req.session_index,
        context_tokens=req.context_tokens,
        turn=req.turn,
        prompt=job.keys,
        output_tokens=job.output_tokens,
        output_ids=output_ids[: job.output_tokens],
        content_tokens=req.content_tokens,
        prompt_digest=req.prompt_digest(),
        expected=req.expected,
        trace_line=req.trace_line,
        prefix=req.prefix,
    )
