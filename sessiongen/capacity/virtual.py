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

The block's experiment (warm-ups, session starts, slots, think times, placements) is
:mod:`sessiongen.experiment`'s, which replay follows too: :class:`VirtualBlock` is its
driver on an event heap beside the engine. Prompts are :mod:`.prompts`' (exact, or by
shape for runs too large to tokenize).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from sessiongen.capacity.prompts import EXACT_SESSIONS, Prompts, Tokens, Turn, block_ids
from sessiongen.capacity.routers import MODELED, RouterModel
from sessiongen.capacity.rows import BlockFacts, PlannedRecords, PlannedRow
from sessiongen.design.blocks import BlockPlan, plan_blocks
from sessiongen.design.load import concurrency
from sessiongen.errors import ScenarioError
from sessiongen.experiment.facts import Placed, TurnFacts, warmup_placed
from sessiongen.experiment.head import block_entry, run_head
from sessiongen.experiment.script import BlockScript, Send
from sessiongen.experiment.warmups import Warmup, warmup_tokens, warmups
from sessiongen.infra.collector import no_collections
from sessiongen.infra.files import ensure_dir, output_error
from sessiongen.infra.progress import BlockProgress
from sessiongen.infra.stages import stage
from sessiongen.records import io
from sessiongen.records.format import Manifest, TargetInfo
from sessiongen.scenario.routerspec import GATEWAY, router_policy
from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.spec import Scenario
from sessiongen.sim.compiled import resolve
from sessiongen.sim.engine import World
from sessiongen.sim.virtual import Arrival, RequestResult, VirtualDriver

__all__ = ["EXACT_SESSIONS", "Prompts", "Tokens", "Turn", "block_ids", "plan_run", "virtual_replay"]

#: What a plan run's manifest says of its target.
PLAN_NOTE = (
    "PLANNED: the simulator's engine on a virtual clock (no server, no wall time); "
    "every duration is modeled, none measured"
)


class VirtualBlock:
    """One block of the plan on a fresh virtual cluster (replay's block, without HTTP):
    the experiment's script (:class:`~sessiongen.experiment.script.BlockScript`) driven
    on an event heap beside the engine.

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
        self.script = BlockScript(
            prompts.sessions,
            offsets=prompts.builder.starts(plan.level),
            concurrency=concurrency(scenario, plan.level),
            placement=plan.placement,
            routed=self.router is not None,
            replicas=self.replicas,
            seed=scenario.seed,
            block=plan.block,
        )
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._turns: dict[int, list[Turn]] = {}
        self._warm: Iterator[Warmup] = iter(())
        self._warm_turn: tuple[str, Turn] | None = None

    def at(self, t: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), action))

    def run(self) -> float:
        """Run the block to its end; returns the modeled seconds it took.

        Session starts are not events in the queue (a day's 86,400 would make every pop
        walk a deep heap): the script keeps them, and the next one goes before any event
        at the same time. The engine runs up to (not including) the next start or event
        in one call, stopping after the time at which a request finishes (its callback
        may start something from then on): the order of one engine time a call, with a
        quarter of the calls.
        """
        n = self.replicas
        rounds = self.scenario.design.warmup_requests
        routed = self.router is not None
        self._warm = iter(warmups(block=self.plan.block, replicas=n, rounds=rounds, routed=routed))
        self._next_warmup(0.0)
        cluster = self.driver.cluster
        events = self._events
        script = self.script
        while True:
            engine_t = cluster.next_time()
            start_t = script.next_start()
            if (
                start_t is not None
                and (not events or start_t <= events[0][0])
                and (engine_t is None or start_t <= engine_t)
            ):
                send = script.start_next()
                if send is not None:
                    self._send(send)
                continue
            if events and (engine_t is None or events[0][0] <= engine_t):
                t, _seq, action = heapq.heappop(events)
                action(t)
            elif engine_t is not None:
                bound = min(
                    math.inf if start_t is None else start_t, events[0][0] if events else math.inf
                )
                # engine_t < bound here, so the largest time below the bound is >= engine_t
                self.driver.run(math.nextafter(bound, -math.inf), settle=True)
            else:
                break
        return max(self.driver.now, 0.0)

    def _next_warmup(self, t: float) -> None:
        warm = next(self._warm, None)
        if warm is None:
            self.script.started(t)
            return
        if self._warm_turn is None or self._warm_turn[0] != warm.key:
            self._warm_turn = (warm.key, self.prompts.warmup(warm.key, self.warmup_tokens))
        turn = self._warm_turn[1]
        self._submit(t, self._replica(warm.replica, turn), turn, (warm, turn))

    def _send(self, send: Send, _now: float | None = None) -> None:
        """A turn of the script, due now: its prompts are prepared as its session begins."""
        if send.turn == 1:
            self._turns[send.session] = self.prompts.turns(self.prompts.sessions[send.session])
        turn = self._turns[send.session][send.turn - 1]
        self._submit(send.at, self._replica(send.replica, turn), turn, send, send.noise_key)

    def _replica(self, placed: int | None, turn: Turn) -> int:
        if placed is not None:
            return placed
        assert self.router is not None
        return self.router.route(turn.session_id, turn.prompt.local.keys)

    def _submit(
        self, t: float, replica: int, turn: Turn, tag: object, noise_key: str | None = None
    ) -> None:
        self.driver.submit(
            Arrival(
                at=t,
                replica=replica,
                prompt=turn.prompt,
                max_tokens=turn.output_tokens,
                output_ids=turn.output_ids,
                answer=turn.answer,
                tag=tag,
                noise_key=noise_key,
            )
        )

    def _done(self, result: RequestResult) -> None:
        if self.router is not None:
            self.router.finished(result.replica)
        end = result.finished_s
        tag = result.tag
        if not isinstance(tag, Send):
            warm, turn = tag
            self.emit(self._row(result, turn, warmup_placed(warm.hop), warmup=True))
            self.at(end, self._next_warmup)
            return
        turns = self._turns[tag.session]
        turn = turns[tag.turn - 1]
        placed, follow = self.script.finished(tag, replica=result.replica, ok=True, end_t=end)
        self.emit(self._row(result, turn, placed, warmup=False))
        if tag.turn == len(turns):
            del self._turns[tag.session]
        if follow is not None:
            self.at(follow.at, functools.partial(self._send, follow))

    def _row(
        self, result: RequestResult, turn: Turn, placed: Placed, *, warmup: bool
    ) -> PlannedRow:
        facts = TurnFacts.of(
            turn, placed, replica=result.replica, warmup=warmup, prompt_digest=turn.prompt_digest
        )
        return planned_row(facts, result, start_s=self.start_s)


def planned_row(facts: TurnFacts, result: RequestResult, *, start_s: float) -> PlannedRow:
    """A turn's planned record: its facts, and what the engine modeled of it (every
    duration from the request's arrival; ``start_s``: the block's start in the run)."""
    ttft = result.first_token_s - result.arrival_s
    return PlannedRow(
        session_id=facts.session_id,
        session_index=facts.session_index,
        context_tokens=facts.context_tokens,
        turn=facts.turn,
        replica=result.replica,
        cross_replica=facts.cross_replica is True,
        warmup=facts.warmup,
        prompt_tokens=result.prompt_tokens,
        content_tokens=facts.content_tokens,
        cached_tokens=result.local_hit_tokens + result.pool_hit_tokens,
        completion_tokens=result.output_tokens,
        queue_s=facts.queue_s,
        ttfb_s=ttft,
        ttft_s=ttft,
        e2e_s=result.finished_s - result.arrival_s,
        send_s=start_s + result.arrival_s,
        local_hit_tokens=result.local_hit_tokens,
        external_hit_tokens=result.pool_hit_tokens,
        expected=facts.expected,
        prompt_digest=facts.prompt_digest,
        server_ttft_s=ttft,
        arrival_s=facts.arrival_s,
        think_s=facts.think_s,
        server_queue_s=result.admitted_s - result.arrival_s,
        trace_line=facts.trace_line,
        trace_shared_blocks=facts.trace_shared_blocks,
        trace_shared_tokens=facts.trace_shared_tokens,
        trace_reuse_distance=facts.trace_reuse_distance,
    )


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


def plan_target(scenario: Scenario, mode: str, engine: str) -> TargetInfo:
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
    skip: Mapping[int, float] | None = None,
) -> PlannedRun:
    """Every block of ``scenario`` on the virtual clock, kept in memory (nothing written:
    a sweep's worker on another machine hands it back to be written where the user is).

    ``skip``: blocks (by number) planned elsewhere already, with the modeled seconds each
    took there: they are neither planned nor recorded (their caller brings their
    records), and the clock moves past each as it did there, so the blocks after it
    start where they would have."""
    skip = skip or {}
    check_plannable(scenario)
    engine = resolve()
    salt = os.urandom(6).hex()
    with stage("simulated pair set up (profile, tokenizer)"):
        world = World(scenario.target.sim, scenario.model.name, shared_cache=True)
    with stage("sessions and prompts set up (trace read, text generator)"):
        prompts = Prompts(scenario, world, salt, tokens)
    plan = plan_blocks(scenario, list(scenario.design.blocks))
    # replay's warm-up length on the simulated pair, whose pool chunk is the profile's
    profile = scenario.target.sim
    warm_tokens = warmup_tokens(scenario.design.warmup_tokens, profile.pool_chunk_tokens)
    manifest = run_head(
        scenario,
        run_id=run_id,
        salt=salt,
        tokenizer=prompts.builder.tokenizer.identity,
        text_generator=prompts.builder.generator.identity,
        target=plan_target(scenario, prompts.mode, engine),
        plan=plan,
    )
    writer = PlannedRecords()
    start = 0.0
    per_block = sum(s.turns for s in prompts.sessions)
    for block in plan:
        if block.block in skip:
            start += skip[block.block]
            continue
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

        entry = block_entry(block, salt=salt, status="ok")
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
            warmup_tokens=warm_tokens,
        )
        with no_collections():  # (infra.collector: a block's objects make no cycles)
            took = runner.run()
        bar.close()
        entry["ended_at"] = io.now_iso()
        entry["modeled_s"] = took
        manifest["blocks"].append(entry)
        start += took
    manifest["ended_at"] = io.now_iso()
    manifest["complete"] = True
    with stage("records framed"):
        frame = writer.frame()
    return PlannedRun(manifest, frame)


@dataclass(frozen=True)
class ConfigTask:
    """One configuration as a sweep's worker runs it: its scenario and run id."""

    scenario: Scenario
    run_id: str
    tokens: Tokens
    progress: bool
    #: Blocks not to plan, each with the modeled seconds it took where it was planned
    #: (:func:`plan_run`'s ``skip``).
    skip: tuple[tuple[int, float], ...] = ()


def plan_config(task: ConfigTask) -> PlannedRun:
    """One configuration on the virtual clock, in memory: a sweep's task, here rather
    than in :mod:`.plan` so a worker process imports the engine, not the report stack
    (1.9 s against 8 s on this machine)."""
    return plan_run(
        task.scenario,
        run_id=task.run_id,
        tokens=task.tokens,
        progress=task.progress,
        skip=dict(task.skip),
    )
