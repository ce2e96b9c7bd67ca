"""A scenario replayed on the virtual clock: the same blocks, sessions and records as a
replay on the simulated pair, in seconds of CPU instead of hours of wall time.

:func:`virtual_replay` runs each block of the scenario's plan (placement, load level,
cache arm) on a fresh :class:`~sessiongen.sim.virtual.VirtualDriver` (the served
simulator's engine, without HTTP or sleeping), as replay runs each block on freshly
started replicas: the same warm-ups, the same sessions in the same order, the same
arrival schedule, think times and concurrency slots, the same placements. Where a
router picks the replica, a model of its policy does (:mod:`.routers`). It writes a
run folder like replay's (``manifest.json``, ``requests.parquet``), with target kind
``plan`` and time scale 1: every duration is modeled seconds, none of them measured.

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

import collections
import contextlib
import functools
import gc
import heapq
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import orjson
import polars as pl
from numpy.typing import NDArray

from sessiongen.capacity.routers import MODELED, RouterModel
from sessiongen.capacity.rows import BlockFacts, PlannedRecords, PlannedRow
from sessiongen.design.arrivals import START_STAGGER_S
from sessiongen.design.blocks import BlockPlan, plan_blocks
from sessiongen.design.placement import replica_for
from sessiongen.errors import ScenarioError
from sessiongen.infra.files import ensure_dir, output_error
from sessiongen.infra.progress import BlockProgress
from sessiongen.records import io
from sessiongen.records.format import SCHEMA_VERSION, BlockEntry, Manifest
from sessiongen.scenario.routerspec import GATEWAY, router_policy
from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.spec import Scenario
from sessiongen.sim.cache import PromptKeys
from sessiongen.sim.compiled import resolve
from sessiongen.sim.engine import Job, World
from sessiongen.sim.noise import request_key
from sessiongen.sim.virtual import Arrival, RequestResult, VirtualDriver
from sessiongen.workload.reuse import PrefixFacts
from sessiongen.workload.sessions import Session, SessionBuilder, TurnRequest
from sessiongen.workload.textgen import generator_for

Tokens = Literal["auto", "exact", "shape"]

#: ``tokens = "auto"`` prepares every prompt exactly up to this many sessions per block.
EXACT_SESSIONS = 256

#: Seed of the synthetic system prompt every shaped session shares (session seeds are
#: their indexes, far below it).
_HEAD_SEED = 1 << 40

#: What a plan run's manifest says of its target.
PLAN_NOTE = (
    "PLANNED: the simulator's engine on a virtual clock (no server, no wall time); "
    "every duration is modeled, none measured"
)


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
    home_key: int = -1  # what client placements key on (-1: the session index)
    trace_line: int | None = None
    prefix: PrefixFacts | None = None


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

    def prepare(self, req: TurnRequest) -> Job:
        """The served simulator's own preparation of one request body."""
        raw = orjson.dumps(req.body(self.scenario))
        return self.world.prepare(raw, self.scenario.model.api)

    def exact_turns(self, session: Session) -> list[Turn]:
        live = self.scenario.sessions.history == "live"
        answers: list[str] = []
        out: list[Turn] = []
        for k in range(1, session.turns + 1):
            req = session.request(k, answers if live else None)
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

    def _hashed(self, session: Session) -> list[Turn]:
        """A trace session's turns with prompts made from their hash ids (module doc)."""
        assert session.trace is not None
        head, tail = self._chat_template()
        spec = self.scenario.sessions.trace
        by_prefix = spec.placement_key == "prefix"
        ids = self._ids
        out: list[Turn] = []
        for k, t in enumerate(session.trace.turns, start=1):
            req = t.request
            content = block_ids(req.hash_ids, req.input_length, spec.block_tokens)
            out.append(
                Turn(
                    session_id=session.session_id,
                    session_index=session.index,
                    context_tokens=session.context_tokens,
                    turn=k,
                    prompt=head.extend(np.concatenate((content, tail))),
                    output_tokens=req.output_length,
                    output_ids=ids.take(req.output_length),
                    content_tokens=req.input_length,
                    prompt_digest=None,
                    expected=None,
                    home_key=req.hash_ids[0] if by_prefix else -1,
                    trace_line=req.line,
                    prefix=t.facts,
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


class _Ids:
    """Random token ids, drawn many thousand at a time (a draw's fixed cost is most of a
    turn's few hundred ids) and handed out in order."""

    def __init__(self, rng: np.random.Generator, batch: int = 1 << 16) -> None:
        self.rng = rng
        self.batch = batch
        self._ids: NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)
        self._at = 0

    def take(self, n: int) -> NDArray[np.uint64]:
        n = max(n, 0)
        if self._at + n > len(self._ids):
            self._ids = _ids(self.rng, max(n, self.batch))
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
        home_key=req.home_key,
        trace_line=req.trace_line,
        prefix=req.prefix,
    )


@dataclass
class _Live:
    """A session while its block runs: its turns, where it is, where its last turn ran."""

    session: Session
    offset_s: float | None  # open loop: scheduled start after the block's sessions begin
    ready_at: float  # when it wanted a concurrency slot
    think: list[float]
    turns: list[Turn] = field(default_factory=list)
    queue_s: float = 0.0
    previous: int | None = None


@dataclass(frozen=True)
class _Warm:
    """A warm-up request: its turn, the replica it goes to (None: through the router)."""

    turn: Turn
    replica: int | None
    hop: int


class VirtualBlock:
    """One block of the plan on a fresh virtual cluster (replay's block, without HTTP).

    Events of the planner (a turn's arrival, a session's start) and of the engine are
    processed in time order: the planner's first at equal times, so a turn arriving as
    a step ends joins the next step, as the served simulator orders them. Routing is
    decided at the arrival, with the router's in-flight counts as they are then.
    """

    def __init__(
        self,
        scenario: Scenario,
        plan: BlockPlan,
        prompts: Prompts,
        emit: Callable[[PlannedRow], None],
        *,
        start_s: float,
        engine: Literal["python", "compiled"] = "python",
        warmup_tokens: int,
    ) -> None:
        self.scenario = scenario
        self.plan = plan
        self.prompts = prompts
        self.emit = emit
        self.start_s = start_s
        self.warmup_tokens = warmup_tokens
        profile = prompts.world.profile
        self.replicas = profile.replicas
        self.driver = VirtualDriver(
            profile,
            shared_cache=plan.cache == "on",
            on_finish=self._done,
            keep_results=False,
            engine=engine,
            noise_seed=(scenario.seed, plan.block),
        )
        policy = router_policy(plan.placement)
        self.router = RouterModel(policy, self.replicas, scenario.seed) if policy else None
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._waiting: collections.deque[_Live] = collections.deque()
        self._starts: list[tuple[float, int]] = []
        self._offsets: list[float] | None = None
        self._slots = self._concurrency()
        self._warm: Iterator[_Warm] = iter(())

    def _concurrency(self) -> int:
        load = self.scenario.load
        if load.arrival == "closed" and not self.prompts.builder.is_trace:
            return int(self.plan.level)
        return load.max_in_flight

    def at(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), action))

    def run(self) -> float:
        """Run the block to its end; returns the modeled seconds it took.

        Session starts are not events in the queue (a day's 86,400 would make every pop
        walk a deep heap): the next one waits in :attr:`_starts` and goes before any
        event at the same time, as it did when all were queued first.
        """
        self._warm = iter(self._warmups())
        self._next_warmup(0.0)
        cluster = self.driver.cluster
        events = self._events
        starts = self._starts
        while True:
            engine_t = cluster.next_time()
            if starts:
                start_t = starts[-1][0]
                if (not events or start_t <= events[0][0]) and (
                    engine_t is None or start_t <= engine_t
                ):
                    self._start_next()
                    continue
            if events and (engine_t is None or events[0][0] <= engine_t):
                t, _seq, action = heapq.heappop(events)
                action(t)
            elif engine_t is not None:
                self.driver.run(engine_t)
            else:
                break
        return max(self.driver.now, 0.0)

    # --- warm-ups ---------------------------------------------------------------------

    def _warmups(self) -> Iterator[_Warm]:
        """Replay's warm-ups: per round and replica a prompt on it, then on the next one;
        through the router as well for routed placements."""
        n, block = self.replicas, self.plan.block
        for i in range(self.scenario.design.warmup_requests):
            for r in range(n):
                turn = self.prompts.warmup(f"b{block}-r{r}-{i}", self.warmup_tokens)
                for hop, target in enumerate(dict.fromkeys([r, (r + 1) % n])):
                    yield _Warm(turn, target, hop)
        if self.router is not None:
            for i in range(self.scenario.design.warmup_requests * max(1, n)):
                yield _Warm(self.prompts.warmup(f"b{block}-gw-{i}", self.warmup_tokens), None, 0)

    def _next_warmup(self, t: float) -> None:
        warm = next(self._warm, None)
        if warm is None:
            self._start_sessions(t)
            return
        replica = warm.replica
        if replica is None:
            assert self.router is not None
            replica = self.router.route(warm.turn.session_id, warm.turn.prompt.local.keys)
        self._submit(t, replica, warm.turn, ("warmup", warm))

    # --- sessions ---------------------------------------------------------------------

    def _start_sessions(self, t: float) -> None:
        """Every session's start, latest first (popped from the end): scheduled offsets,
        or closed-loop sessions a stagger apart; ties in the sessions' order."""
        offsets = self.prompts.builder.starts(self.plan.level)
        self._offsets = offsets
        starts = [
            (t + (i * START_STAGGER_S if offsets is None else offsets[s.index]), i)
            for i, s in enumerate(self.prompts.sessions)
        ]
        starts.sort(reverse=True)
        self._starts[:] = starts  # in place: run() holds the list

    def _start_next(self) -> None:
        start, i = self._starts.pop()
        session = self.prompts.sessions[i]
        offset = None if self._offsets is None else self._offsets[session.index]
        self._wants_slot(_Live(session, offset, 0.0, session.pauses()), start)

    def _wants_slot(self, live: _Live, now: float) -> None:
        """A session asks for a concurrency slot (closed loop: the level; open loop:
        ``load.max_in_flight``); it waits in order when none is free."""
        live.ready_at = now
        if self._slots > 0:
            self._slots -= 1
            self._begin(live, now)
        else:
            self._waiting.append(live)

    def _begin(self, live: _Live, now: float) -> None:
        live.queue_s = now - live.ready_at
        live.turns = self.prompts.turns(live.session)
        self._arrive(live, 0, now)

    def _release(self, now: float) -> None:
        if self._waiting:
            self._begin(self._waiting.popleft(), now)
        else:
            self._slots += 1

    def _arrive(self, live: _Live, k: int, now: float) -> None:
        turn = live.turns[k]
        if self.router is not None:
            replica = self.router.route(turn.session_id, turn.prompt.local.keys)
        else:
            seed = self.scenario.seed
            index = live.session.index if turn.home_key < 0 else turn.home_key
            replica = replica_for(self.plan.placement, index, turn.turn, self.replicas, seed)
        key = request_key(self.scenario.seed, self.plan.block, turn.session_index, turn.turn)
        self._submit(now, replica, turn, (live, k), key)

    def _submit(
        self, t: float, replica: int, turn: Turn, tag: Any, noise_key: str | None = None
    ) -> None:
        self.driver.submit(
            Arrival(
                at=t,
                replica=replica,
                prompt=turn.prompt,
                max_tokens=turn.output_tokens,
                output_ids=turn.output_ids,
                tag=tag,
                noise_key=noise_key,
            )
        )

    def _done(self, result: RequestResult) -> None:
        if self.router is not None:
            self.router.finished(result.replica)
        end = result.finished_s
        owner, k = result.tag
        if owner == "warmup":
            warm: _Warm = k
            self.emit(self._record(result, warm.turn, warmup=True, cross=warm.hop > 0))
            self.at(end, self._next_warmup)
            return
        live: _Live = owner
        turn = live.turns[k]
        first = k == 0
        cross = False if first else (live.previous != result.replica)
        record = self._record(
            result,
            turn,
            warmup=False,
            cross=cross,
            queue_s=live.queue_s if first else 0.0,
            arrival_s=live.offset_s,
            think_s=live.think[k],
        )
        self.emit(record)
        live.previous = result.replica
        if k + 1 < len(live.turns):
            self.at(end + live.think[k + 1], functools.partial(self._arrive, live, k + 1))
        else:
            live.turns = []
            self.at(end, self._release)

    def _record(
        self,
        result: RequestResult,
        turn: Turn,
        *,
        warmup: bool,
        cross: bool,
        queue_s: float = 0.0,
        arrival_s: float | None = None,
        think_s: float | None = None,
    ) -> PlannedRow:
        prefix = turn.prefix
        ttft = result.first_token_s - result.arrival_s
        return PlannedRow(
            turn.session_id,
            turn.session_index,
            turn.context_tokens,
            turn.turn,
            result.replica,
            cross,
            warmup,
            result.prompt_tokens,
            turn.content_tokens,
            result.local_hit_tokens + result.pool_hit_tokens,
            result.output_tokens,
            queue_s,
            ttft,
            ttft,
            result.finished_s - result.arrival_s,
            self.start_s + result.arrival_s,
            result.local_hit_tokens,
            result.pool_hit_tokens,
            turn.expected,
            turn.prompt_digest,
            ttft,
            arrival_s,
            think_s,
            result.admitted_s - result.arrival_s,
            turn.trace_line,
            None if prefix is None else prefix.shared_blocks,
            None if prefix is None else prefix.shared_tokens,
            None if prefix is None else prefix.reuse_distance,
        )


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    """Run a block with the cyclic garbage collector off.

    A block allocates millions of small objects that are freed by reference counting
    (the engine's and the planner's objects make no cycles that outlive a block: a KV
    run evicted leaves its tree), so the collector's passes find nothing: at a
    threshold of 100,000 allocations they still took 12% of a planned hour's CPU with
    the compiled engine (perf), walking the live sessions' objects; off, the same peak
    memory. Whatever cycles a block leaves are collected when it ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_plannable(scenario: Scenario) -> None:
    """A one-line :class:`ScenarioError` for what the planner cannot model."""
    for placement in scenario.placement.policies:
        if placement == GATEWAY:
            raise ScenarioError(
                scenario.source,
                "placement.policies",
                "gateway: the planner cannot model your own router; use router:POLICY",
            )
        policy = router_policy(placement)
        if policy is not None and policy not in MODELED:
            raise ScenarioError(
                scenario.source,
                "placement.policies",
                f"{placement}: not modeled by the planner (modeled: {', '.join(MODELED)})",
            )


def warmup_tokens(scenario: Scenario) -> int:
    """Replay's warm-up length on the simulator: ``design.warmup_tokens``, else two pool
    chunks (at least 256 tokens)."""
    given = scenario.design.warmup_tokens
    return given if given is not None else max(256, 2 * scenario.target.sim.pool_chunk_tokens)


def plan_target(scenario: Scenario, mode: str, engine: str) -> dict[str, Any]:
    """The manifest's ``target`` of a plan run (``engine``: which engine planned it,
    ``compiled`` or ``python``; they give the same records)."""
    profile = scenario.target.sim
    return {
        "kind": "plan",
        "simulated": True,
        "note": PLAN_NOTE,
        "time_scale": 1.0,
        "replicas": profile.replicas,
        "profile": to_plain(profile),
        "prompts": mode,
        "engine": engine,
    }


@dataclass(frozen=True)
class PlannedRun:
    """A planned run before it is written: its manifest and its request records."""

    manifest: Manifest
    requests: pl.DataFrame


def virtual_replay(
    scenario: Scenario,
    runs_dir: Path,
    *,
    run_id: str | None = None,
    tokens: Tokens = "auto",
    progress: bool = False,
) -> Path:
    """Replay ``scenario`` on the virtual clock (module doc); returns the run folder."""
    check_plannable(scenario)
    run_id = run_id or io.new_run_id(scenario.name)
    run_dir = _new_folder(ensure_dir(runs_dir) / run_id)
    return write_run(run_dir, plan_run(scenario, run_id=run_id, tokens=tokens, progress=progress))


def _new_folder(run_dir: Path) -> Path:
    try:
        run_dir.mkdir()
    except OSError as exc:
        raise output_error(run_dir, exc) from None
    return run_dir


def write_run(run_dir: Path, planned: PlannedRun) -> Path:
    """Write a planned run as a run folder (``requests.parquet``, ``manifest.json``),
    creating ``run_dir`` unless it exists; returns it."""
    if not run_dir.is_dir():
        _new_folder(run_dir)
    io.atomic_write_parquet(run_dir / "requests.parquet", planned.requests)
    io.write_manifest(run_dir, planned.manifest)
    return run_dir


def plan_run(
    scenario: Scenario,
    *,
    run_id: str,
    tokens: Tokens = "auto",
    progress: bool = False,
) -> PlannedRun:
    """Every block of ``scenario`` on the virtual clock, kept in memory (nothing written:
    a sweep's worker on another machine hands it back to be written where the user is)."""
    check_plannable(scenario)
    engine = resolve()
    salt = os.urandom(6).hex()
    world = World(scenario.target.sim, scenario.model.name, shared_cache=True)
    prompts = Prompts(scenario, world, salt, tokens)
    plan = plan_blocks(scenario, list(scenario.design.blocks))
    manifest: Manifest = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "scenario_name": scenario.name,
        "scenario_source": scenario.source,
        "scenario": scenario.to_dict(),
        "scenario_digest": scenario.digest(),
        "seed": scenario.seed,
        "salt": salt,
        "tokenizer": prompts.builder.tokenizer.identity,
        "text_generator": prompts.builder.generator.identity,
        "tool": io.tool_identity(),
        "host": io.host_facts(),
        "target": plan_target(scenario, prompts.mode, engine),
        "block_order": [{"placement": b.placement, "cache": b.cache} for b in plan],
        "blocks": [],
        "started_at": io.now_iso(),
        "ended_at": None,
        "complete": False,
    }
    writer = PlannedRecords()
    start = 0.0
    per_block = sum(s.turns for s in prompts.sessions)
    for block in plan:
        bar = BlockProgress(
            per_block,
            f"[{block.block + 1}] {block.placement} cache={block.cache} (virtual)",
            enabled=progress,
            time_scale=1.0,
            unit="modeled seconds",
        )

        def emit(row: PlannedRow, bar: BlockProgress = bar) -> None:
            writer.add(row)
            if not row.warmup:
                bar.update(row)

        entry: BlockEntry = {
            "block": block.block,
            "placement": block.placement,
            "cache": block.cache,
            "block_in_placement": block.block_in_placement,
            "salt": salt,
            "status": "ok",
            "started_at": io.now_iso(),
        }
        writer.begin(
            BlockFacts(
                run_id=run_id,
                block=block.block,
                block_in_placement=block.block_in_placement,
                placement=block.placement,
                cache=block.cache,
                load_level=block.level,
                routed=router_policy(block.placement) is not None,
            )
        )
        runner = VirtualBlock(
            scenario,
            block,
            prompts,
            emit,
            start_s=start,
            engine=engine,
            warmup_tokens=warmup_tokens(scenario),
        )
        with _no_collections():
            took = runner.run()
        bar.close()
        entry["ended_at"] = io.now_iso()
        entry["modeled_s"] = took
        manifest["blocks"].append(entry)
        start += took
    manifest["ended_at"] = io.now_iso()
    manifest["complete"] = True
    return PlannedRun(manifest, writer.frame())


@dataclass(frozen=True)
class ConfigTask:
    """One configuration as a sweep's worker runs it: its scenario and run id."""

    scenario: Scenario
    run_id: str
    tokens: Tokens
    progress: bool


def plan_config(task: ConfigTask) -> PlannedRun:
    """One configuration on the virtual clock, in memory: a sweep's task, here rather
    than in :mod:`.plan` so a worker process imports the engine, not the report stack
    (1.9 s against 8 s on this machine)."""
    return plan_run(task.scenario, run_id=task.run_id, tokens=task.tokens, progress=task.progress)
