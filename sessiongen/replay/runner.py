"""Run sessions' turns against replicas and turn each measured request into a record.

Shared by replay's own event loop and by worker processes (``replay --workers N``): a
:class:`BlockContext` says where the block's requests go and hands every finished
request's :class:`~sessiongen.records.format.RequestRecord` to its ``emit`` callback
(which records it, updates progress, or ships it to the parent process).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from sessiongen.client import counters
from sessiongen.client.driver import CHAT_PATH, COMPLETIONS_PATH, Client, Result
from sessiongen.client.lagmon import LagMonitor
from sessiongen.design.arrivals import START_STAGGER_S
from sessiongen.design.blocks import BlockPlan
from sessiongen.records.format import RequestRecord
from sessiongen.replay import modeled, routing
from sessiongen.replay.modeled import ModeledClock
from sessiongen.scenario.spec import Scenario
from sessiongen.sim.noise import request_key
from sessiongen.targets.base import ServedBy
from sessiongen.text.probes import grade
from sessiongen.workload.sessions import Session, TurnRequest

Emit = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class BlockContext:
    """One block's fixed facts and the callback that receives its records."""

    scenario: Scenario
    client: Client
    urls: tuple[str, ...]
    plan: BlockPlan
    run_id: str
    t0_ns: int  # perf_counter_ns of the run's start (system-wide monotonic on Linux)
    time_scale: float  # wall seconds per modeled second of the target
    lag: LagMonitor
    emit: Emit
    gateway: str | None = None  # routed placements: where every turn goes
    served_by: ServedBy = ServedBy()  # how responses name the replica that served them
    # State modeled arrivals where the replicas share one simulated clock (the block's
    # sessions all run on this loop: :mod:`sessiongen.replay.modeled`).
    modeled_arrivals: bool = False

    @property
    def api_path(self) -> str:
        return CHAT_PATH if self.scenario.model.api == "chat" else COMPLETIONS_PATH

    @property
    def open_loop(self) -> bool:
        """Sessions start on a schedule: an open-loop load, or a trace's timestamps."""
        sc = self.scenario
        return sc.load.arrival != "closed" or sc.sessions.source == "trace"

    @property
    def exact_counters(self) -> bool:
        """Counters around each request are exact only when requests never overlap: one
        session at a time (a closed loop at level 1, or an open loop or a trace capped at
        one session in flight, ``load.max_in_flight = 1``: a session holds its slot for
        all its turns, which it sends one after another)."""
        return self.concurrency == 1

    @property
    def concurrency(self) -> int:
        """Sessions in flight at most: the closed loop's level, or the open loop's cap."""
        load = self.scenario.load
        return load.max_in_flight if self.open_loop else int(self.plan.level)


def record_of(
    ctx: BlockContext,
    req: TurnRequest,
    res: Result,
    *,
    replica: int | None,
    cross_replica: bool | None,
    warmup: bool,
    queue_s: float,
    before: counters.Snapshot | None = None,
    after: counters.Snapshot | None = None,
    arrival_s: float | None = None,
    think_s: float | None = None,
    replica_source: str = "placement",
) -> RequestRecord:
    """The record of one finished request: where it went, what it asked, what was measured.

    Hit tokens come from the replica's counters read around the request when nothing
    overlapped it (``hit_source`` ``counters``, exact), else from the server's own
    account of the request where it gives one (the simulator's ``sim`` object:
    ``server``), else they are unknown (``cached_tokens`` from usage still says how many
    prompt tokens hit some cache).
    """
    plan = ctx.plan
    local, external, source = _hits(res, before, after)
    return RequestRecord(
        run_id=ctx.run_id,
        block=plan.block,
        block_in_placement=plan.block_in_placement,
        placement=plan.placement,
        cache=plan.cache,
        session_id=req.session_id,
        session_index=req.session_index,
        context_tokens=req.context_tokens,
        turn=req.turn,
        replica=replica,
        cross_replica=cross_replica,
        warmup=warmup,
        prompt_tokens=res.prompt_tokens,
        content_tokens=req.content_tokens,
        cached_tokens=res.cached_tokens,
        completion_tokens=res.completion_tokens,
        output_chunks=len(res.chunk_ns),
        queue_s=queue_s,
        ttfb_s=res.ttfb_s,
        ttft_s=res.ttft_s,
        e2e_s=res.e2e_s,
        itl_p50_s=res.itl_p50_s(),
        itl_max_s=res.itl_max_s(),
        send_s=(res.send_ns - ctx.t0_ns) / 1e9,
        status=res.status,
        http_status=res.http_status,
        error=res.error,
        local_hit_tokens=local,
        external_hit_tokens=external,
        expected=req.expected,
        answer_correct=grade(req.expected, res.text) if res.ok else None,
        output_digest=res.output_digest(),
        output_text=res.text[:200] if res.ok else None,
        first_logprob=res.first_logprob,
        loop_lag_flag=lag_matters(ctx.lag, res),
        prompt_digest=req.prompt_digest(),
        trace_line=req.trace_line,
        trace_shared_blocks=None if req.prefix is None else req.prefix.shared_blocks,
        trace_shared_tokens=None if req.prefix is None else req.prefix.shared_tokens,
        trace_reuse_distance=None if req.prefix is None else req.prefix.reuse_distance,
        server_ttft_s=_server_ttft_s(res),
        server_queue_s=_server_fact_s(res, "modeled_queue_s"),
        arrival_late_s=_server_fact_s(res, "arrival_late_s"),
        load_level=plan.level,
        arrival_s=arrival_s,
        think_s=think_s,
        hit_source=source,
        replica_source=replica_source,
    )


def _hits(
    res: Result, before: counters.Snapshot | None, after: counters.Snapshot | None
) -> tuple[int | None, int | None, str | None]:
    """(local hit tokens, external hit tokens, where they come from)."""
    local = counters.delta(before, after, counters.LOCAL_HITS)
    external = counters.delta(before, after, counters.EXTERNAL_HITS)
    if local is not None or external is not None:
        return local, external, "counters"
    sim = res.server_facts("sim")
    sim_local, sim_pool = sim.get("local_hit_tokens"), sim.get("pool_hit_tokens")
    if isinstance(sim_local, int) and isinstance(sim_pool, int):
        return sim_local, sim_pool, "server"
    return None, None, None


def lag_matters(lag: LagMonitor, res: Result) -> bool:
    """Whether the request is lag-flagged (:meth:`LagMonitor.lag_flag`): stalls while it
    waited for its first token (until now, if none came) above 2% of that wait."""
    end = res.chunk_ns[0] if res.chunk_ns else time.perf_counter_ns()
    return lag.lag_flag(res.send_ns, end)


def _server_fact_s(res: Result, name: str) -> float | None:
    """A modeled duration from the simulator's ``sim`` facts, in wall seconds."""
    sim = res.server_facts("sim")
    modeled, scale = sim.get(name), sim.get("time_scale")
    if isinstance(modeled, int | float) and isinstance(scale, int | float):
        return float(modeled) * float(scale)
    return None


def _server_ttft_s(res: Result) -> float | None:
    """The TTFT the server says it gave (wall seconds), where it says one.

    The simulator puts its own account in the final usage chunk's ``sim`` object: the
    modeled TTFT and the time scale it ran at; their product is the wall time the
    client should have measured, so ``ttft_s - server_ttft_s`` is the measurement error.
    """
    return _server_fact_s(res, "modeled_ttft_s")


def emit_turn(
    ctx: BlockContext,
    req: TurnRequest,
    res: Result,
    served: routing.Served,
    prev: int | None,
    queue_s: float,
    offset_s: float | None,
    pause_s: float,
) -> None:
    """The record of one session turn (``offset_s`` and ``pause_s`` modeled seconds),
    the same whether the session runs on the wall clock or on the simulator's."""
    scale = ctx.time_scale
    ctx.emit(
        record_of(
            ctx,
            req,
            res,
            replica=served.replica,
            cross_replica=routing.moved(req.turn, prev, served.replica),
            warmup=False,
            queue_s=queue_s,
            before=served.before,
            after=served.after,
            arrival_s=None if offset_s is None else offset_s * scale,
            think_s=pause_s * scale,
            replica_source=served.source,
        )
    )


async def run_session_modeled(
    ctx: BlockContext,
    session: Session,
    slots: asyncio.Queue[float],
    clock: ModeledClock,
    ready_s: float,
    offset_s: float | None,
) -> None:
    """:func:`run_session` on the simulator's modeled clock (:mod:`.modeled`): each turn
    states its modeled arrival, which is ready time or freed slot, then the previous
    turn's modeled end plus the pause."""
    sc = ctx.scenario
    scale = ctx.time_scale
    pauses = session.pauses()
    await clock.sleep_to_send(ready_s)
    freed = await slots.get()
    at = max(ready_s, freed)
    queue_s = (at - ready_s) * scale
    answers: list[str] = []
    prev: int | None = None
    try:
        for turn in range(1, session.turns + 1):
            if turn > 1:
                at += pauses[turn - 1]
            await clock.sleep_to_send(at)
            req = session.request(turn, answers if sc.sessions.history == "live" else None)
            key = request_key(sc.seed, ctx.plan.block, session.index, turn)
            res, served = await routing.send(ctx, req, headers=modeled.header(at, key))
            modeled.measure_from(res)
            emit_turn(ctx, req, res, served, prev, queue_s, offset_s, pauses[turn - 1])
            queue_s = 0.0
            end = modeled.modeled_end(res)
            if not res.ok or end is None:
                at = clock.modeled_at(time.perf_counter_ns())
                return
            at = end
            answers.append(res.text)
            prev = served.replica
    finally:
        slots.put_nowait(at)


async def send_turn(ctx: BlockContext, replica: int, req: TurnRequest) -> Result:
    """Send one request to ``replica`` and measure it."""
    return await ctx.client.send(
        ctx.urls[replica] + ctx.api_path,
        req.body_parts(ctx.scenario),
        timeout_s=ctx.scenario.driver.request_timeout_s,
    )


async def run_session(
    ctx: BlockContext,
    session: Session,
    sem: asyncio.Semaphore,
    start_ns: int,
    offset_s: float | None,
) -> None:
    """All turns of one session, strictly in order; stops at the first failed turn.

    ``offset_s`` (open loop) is the session's scheduled start, modeled seconds after
    ``start_ns``; closed-loop sessions start at once and wait for a concurrency slot.
    Either way the wait for a slot is the first turn's ``queue_s``. Before each later
    turn the session pauses its think time (:func:`~.arrivals.think_times`; a trace
    session: its delays, :meth:`Session.pauses`).
    """
    sc = ctx.scenario
    scale = ctx.time_scale
    if offset_s is not None:
        await _sleep_until(start_ns + int(offset_s * scale * 1e9))
    arrival = time.perf_counter_ns()
    pauses = session.pauses()
    async with sem:
        queue_s = (time.perf_counter_ns() - arrival) / 1e9
        answers: list[str] = []
        prev: int | None = None
        for turn in range(1, session.turns + 1):
            if pauses[turn - 1]:
                await asyncio.sleep(pauses[turn - 1] * scale)
            req = session.request(turn, answers if sc.sessions.history == "live" else None)
            res, served = await routing.send(ctx, req)
            emit_turn(ctx, req, res, served, prev, queue_s, offset_s, pauses[turn - 1])
            queue_s = 0.0
            if not res.ok:
                return
            answers.append(res.text)
            prev = served.replica


async def _sleep_until(deadline_ns: int) -> None:
    delay = (deadline_ns - time.perf_counter_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


async def run_sessions(
    ctx: BlockContext, sessions: list[Session], concurrency: int | None = None
) -> None:
    """A block's sessions under its load: closed loop (at most ``concurrency``, by default
    the level, in flight) or open loop (each session starting on its schedule,
    :func:`~.arrivals.arrival_offsets`, indexed by the session's place in the scenario so
    a worker process running some of them keeps their times; a trace's sessions start
    at their first timestamps)."""
    offsets = sessions[0].builder.starts(ctx.plan.level) if sessions else None
    limit = concurrency or ctx.concurrency
    clock = None
    if ctx.modeled_arrivals and ctx.gateway is None:
        clock = await modeled.read_clock(ctx.client.http, ctx.urls, ctx.time_scale)
    if clock is not None:
        slots: asyncio.Queue[float] = asyncio.Queue()
        for _ in range(limit):
            slots.put_nowait(-math.inf)
        start = clock.start_s
        await asyncio.gather(
            *(
                run_session_modeled(
                    ctx,
                    s,
                    slots,
                    clock,
                    start + (i * START_STAGGER_S if offsets is None else offsets[s.index]),
                    None if offsets is None else offsets[s.index],
                )
                for i, s in enumerate(sessions)
            )
        )
        return
    sem = asyncio.Semaphore(limit)
    start_ns = time.perf_counter_ns()
    await asyncio.gather(
        *(
            run_session(ctx, s, sem, start_ns, None if offsets is None else offsets[s.index])
            for s in sessions
        )
    )
