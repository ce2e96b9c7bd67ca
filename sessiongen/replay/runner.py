"""Replay's driver of a block's script: its sessions' turns sent to replicas on a clock,
each measured request turned into a record.

The experiment (starts, slots, think times, placements, cross-replica marking, stop on
failure) is :class:`~sessiongen.experiment.script.BlockScript`'s; this module keeps the
clock (the wall clock, or the simulated engine's modeled clock: :mod:`.modeled`), HTTP,
counters and loop lag. Shared by replay's own event loop and by worker processes
(``replay --workers N``): a :class:`BlockContext` says where the block's requests go and
hands every finished request's :class:`~sessiongen.records.format.RequestRecord` to its
``emit`` callback (which records it, updates progress, or ships it to the parent process).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sessiongen.client import counters
from sessiongen.client.driver import CHAT_PATH, COMPLETIONS_PATH, Client, Result
from sessiongen.client.lagmon import LagMonitor
from sessiongen.design import load
from sessiongen.design.blocks import BlockPlan
from sessiongen.experiment.facts import TurnFacts
from sessiongen.experiment.script import BlockScript, Send
from sessiongen.records.counters import local_hits
from sessiongen.records.format import RequestRecord
from sessiongen.replay import modeled, routing
from sessiongen.replay.modeled import ModeledClock
from sessiongen.scenario.routerspec import is_routed
from sessiongen.scenario.spec import Scenario
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
    def exact_counters(self) -> bool:
        """Counters around each request are exact only when requests never overlap: one
        session at a time (a closed loop at level 1, or an open loop or a trace capped at
        one session in flight, ``load.max_in_flight = 1``: a session holds its slot for
        all its turns, which it sends one after another)."""
        return self.concurrency == 1

    @property
    def concurrency(self) -> int:
        """Sessions in flight at most (:func:`sessiongen.design.load.concurrency`)."""
        return load.concurrency(self.scenario, self.plan.level)


def record_of(
    ctx: BlockContext,
    facts: TurnFacts,
    res: Result,
    *,
    before: counters.Snapshot | None = None,
    after: counters.Snapshot | None = None,
    replica_source: str = "placement",
) -> RequestRecord:
    """The record of one finished request: the experiment's facts of the turn (modeled
    seconds, here in wall seconds of the target) and what was measured.

    Hit tokens come from the replica's counters read around the request when nothing
    overlapped it (``hit_source`` ``counters``, exact), else from the server's own
    account of the request where it gives one (the simulator's ``sim`` object:
    ``server``), else they are unknown (``cached_tokens`` from usage still says how many
    prompt tokens hit some cache).
    """
    plan = ctx.plan
    scale = ctx.time_scale
    local, external, source = _hits(res, before, after)
    return RequestRecord(
        run_id=ctx.run_id,
        block=plan.block,
        block_in_placement=plan.block_in_placement,
        placement=plan.placement,
        cache=plan.cache,
        session_id=facts.session_id,
        session_index=facts.session_index,
        context_tokens=facts.context_tokens,
        turn=facts.turn,
        replica=facts.replica,
        cross_replica=facts.cross_replica,
        warmup=facts.warmup,
        prompt_tokens=res.prompt_tokens,
        content_tokens=facts.content_tokens,
        cached_tokens=res.cached_tokens,
        completion_tokens=res.completion_tokens,
        output_chunks=len(res.chunk_ns),
        queue_s=facts.queue_s * scale,
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
        expected=facts.expected,
        answer_correct=grade(facts.expected, res.text) if res.ok else None,
        output_digest=res.output_digest(),
        output_text=res.text[:200] if res.ok else None,
        first_logprob=res.first_logprob,
        loop_lag_flag=lag_matters(ctx.lag, res),
        prompt_digest=facts.prompt_digest,
        trace_line=facts.trace_line,
        trace_shared_blocks=facts.trace_shared_blocks,
        trace_shared_tokens=facts.trace_shared_tokens,
        trace_reuse_distance=facts.trace_reuse_distance,
        server_ttft_s=_server_ttft_s(res),
        server_queue_s=_server_fact_s(res, "modeled_queue_s"),
        arrival_late_s=_server_fact_s(res, "arrival_late_s"),
        load_level=plan.level,
        arrival_s=None if facts.arrival_s is None else facts.arrival_s * scale,
        think_s=None if facts.think_s is None else facts.think_s * scale,
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
        return local_hits(local, external, res.cached_tokens), external, "counters"
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


async def send_turn(ctx: BlockContext, replica: int, req: TurnRequest) -> Result:
    """Send one request to ``replica`` and measure it."""
    return await ctx.client.send(
        ctx.urls[replica] + ctx.api_path,
        req.body_parts(ctx.scenario),
        timeout_s=ctx.scenario.driver.request_timeout_s,
    )


class Clock(Protocol):
    """The clock a block's script runs on, as replay keeps it (modeled seconds)."""

    @property
    def start_s(self) -> float: ...
    def now(self) -> float: ...
    async def sleep_until(self, t: float) -> None: ...
    def headers(self, send: Send) -> dict[str, str] | None: ...
    def end_of(self, res: Result) -> float | None: ...


@dataclass(frozen=True)
class WallClock:
    """Modeled seconds as the wall clock gives them (``time_scale`` wall seconds each,
    from ``t0_ns``): requests arrive when they are sent."""

    t0_ns: int
    time_scale: float
    start_s: float = 0.0

    def now(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9 / self.time_scale

    async def sleep_until(self, t: float) -> None:
        delay = (self.t0_ns + int(t * self.time_scale * 1e9) - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    def headers(self, send: Send) -> dict[str, str] | None:
        return None

    def end_of(self, res: Result) -> float | None:
        return self.now()


@dataclass(frozen=True)
class SimClock:
    """The simulated engine's modeled clock (:mod:`.modeled`): each request states when
    it arrives and its noise key, and ends when the simulator says it did."""

    clock: ModeledClock

    @property
    def start_s(self) -> float:
        return self.clock.start_s

    def now(self) -> float:
        return self.clock.modeled_at(time.perf_counter_ns())

    async def sleep_until(self, t: float) -> None:
        await self.clock.sleep_to_send(t)

    def headers(self, send: Send) -> dict[str, str] | None:
        return modeled.header(send.at, send.noise_key)

    def end_of(self, res: Result) -> float | None:
        modeled.measure_from(res)
        return modeled.modeled_end(res)


async def run_sessions(
    ctx: BlockContext, sessions: list[Session], concurrency: int | None = None
) -> None:
    """A block's sessions as the experiment's script says (:mod:`sessiongen.experiment.script`),
    under the block's load (at most ``concurrency`` sessions in flight, by default the
    concurrency rule's): each session's offset indexed by its place in the scenario, so a
    worker process running some of them keeps their times. On one simulated engine the
    script runs on its modeled clock (:mod:`.modeled`), else on the wall clock."""
    sc = ctx.scenario
    script = BlockScript(
        sessions,
        offsets=sessions[0].builder.starts(ctx.plan.level) if sessions else None,
        concurrency=concurrency or ctx.concurrency,
        placement=ctx.plan.placement,
        routed=is_routed(ctx.plan.placement),
        replicas=len(ctx.urls),
        seed=sc.seed,
        block=ctx.plan.block,
    )
    clock: Clock = WallClock(time.perf_counter_ns(), ctx.time_scale)
    if ctx.modeled_arrivals and ctx.gateway is None:
        read = await modeled.read_clock(ctx.client.http, ctx.urls, ctx.time_scale)
        if read is not None:
            clock = SimClock(read)
    await drive(ctx, script, sessions, clock)


async def drive(
    ctx: BlockContext, script: BlockScript, sessions: list[Session], clock: Clock
) -> None:
    """Step ``script`` on ``clock``: start each session when it is due, send each turn when
    it is due, report each end; a task per chain of turns."""
    answers: dict[int, list[str]] = {}

    async def chain(send: Send | None) -> None:
        while send is not None:
            await clock.sleep_until(send.at)
            send = await _turn(ctx, script, sessions, clock, send, answers)

    async with asyncio.TaskGroup() as group:
        script.started(clock.start_s)
        while (t := script.next_start()) is not None:
            await clock.sleep_until(t)
            first = script.start_next()
            if first is not None:
                group.create_task(chain(first))


async def _turn(
    ctx: BlockContext,
    script: BlockScript,
    sessions: list[Session],
    clock: Clock,
    send: Send,
    answers: dict[int, list[str]],
) -> Send | None:
    """Send one turn, record it, and tell the script: the request due next, if any."""
    said = answers.setdefault(send.session, [])
    req = sessions[send.session].request(send.turn, said)
    res, served = await routing.send(ctx, req, replica=send.replica, headers=clock.headers(send))
    end = clock.end_of(res)
    ok = res.ok and end is not None
    placed, follow = script.finished(
        send, replica=served.replica, ok=ok, end_t=end if ok and end is not None else clock.now()
    )
    facts = TurnFacts.of(
        req, placed, replica=served.replica, warmup=False, prompt_digest=req.prompt_digest()
    )
    ctx.emit(
        record_of(
            ctx, facts, res, before=served.before, after=served.after, replica_source=served.source
        )
    )
    if ok:
        said.append(res.text)
    if follow is None or follow.session != send.session:
        answers.pop(send.session, None)
    return follow
