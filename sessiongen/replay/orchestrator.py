"""Replay: run a scenario's sessions against a target, block by block, and record it all.

For each placement policy and load level, the design's blocks run in order (default
OFF, ON, ON, OFF), each on freshly started replicas when the target allows it (or on
kept ones whose caches were emptied, ``design.restart_between_blocks = false``), each
preceded by warm-up requests of distinct content (recorded, flagged ``warmup``,
excluded from results). Sessions run under the block's load (closed loop up to its
concurrency, or open loop on a seeded arrival schedule); a session's turns run
strictly in order, with its think times between them. Every request becomes a record
of ``requests.parquet`` as it completes; each replica's counters are read before and
after every block, every second while it runs, and around every request when one
session runs at a time (which makes per-request hit attribution exact).

A failed request stops its session (later prompts would build on a missing answer);
the run carries on. Ctrl-C stops cleanly and keeps everything measured so far (so do
SIGTERM and SIGHUP under :func:`sessiongen.infra.signals.handling`, as the CLI runs):
the signal cancels the run at an ``await``, every block's replicas and routers are
stopped on the way out, and the manifest says the run is incomplete.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sessiongen.client import counters
from sessiongen.client.driver import Client
from sessiongen.client.lagmon import STALL_S, LagMonitor
from sessiongen.design import load
from sessiongen.design.blocks import BlockPlan, plan_blocks
from sessiongen.design.load import load_levels
from sessiongen.errors import EndpointError, UserError
from sessiongen.experiment.facts import TurnFacts, warmup_placed
from sessiongen.experiment.head import block_entry, block_order, run_head
from sessiongen.experiment.warmups import warmup_tokens, warmups
from sessiongen.infra import signals
from sessiongen.infra.files import ensure_dir, output_error
from sessiongen.infra.progress import BlockProgress
from sessiongen.records import io
from sessiongen.records.format import (
    BlockEntry,
    CounterRecord,
    Manifest,
    RequestRecord,
    merge_facts,
)
from sessiongen.records.meta import RunMeta
from sessiongen.replay import routing, runner, workers
from sessiongen.replay.armcheck import arm_contradiction
from sessiongen.scenario.spec import Scenario
from sessiongen.targets import Target, make_target
from sessiongen.workload.sessions import SessionBuilder, TurnRequest
from sessiongen.workload.textgen import generator_for


@dataclass
class ReplayOptions:
    """How to run a replay (everything not in the scenario)."""

    runs_dir: Path = Path("runs")
    endpoints: list[str] | None = None
    cache: str | None = None
    progress: bool = True
    run_id: str | None = None
    calibrate: bool = False  # measure the client's own overhead first (manifest: calibration)
    workers: int = 1  # processes that run a block's sessions, each with its own event loop


@dataclass
class ReplayResult:
    """What a replay produced."""

    run_dir: Path
    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def failure_summary(self) -> str:
        parts = ", ".join(f"{n} {status}" for status, n in self.failures.most_common())
        return f"{self.failed} of {self.requests} requests failed ({parts}); see {self.run_dir}"


#: Wall seconds between counter scrapes while a block runs.
SCRAPE_EVERY_S = 1.0


class _Recorder:
    """The run folder while a replay writes it: records, counters, the manifest."""

    def __init__(self, run_dir: Path, manifest: Manifest, lag: LagMonitor) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        self.lag = lag
        self.requests = io.TableWriter(run_dir / "requests.parquet", RequestRecord, batch=32)
        self.metrics = io.TableWriter(run_dir / "metrics.parquet", CounterRecord, batch=256)
        self._flushing: asyncio.Future[None] | None = None

    def save_manifest(self) -> None:
        self.manifest["loop_lag"] = self.lag.summary()
        io.write_manifest(self.run_dir, self.manifest)

    def add(self, record: RequestRecord) -> None:
        """Keep a record; write a full batch in a worker thread, off the event loop."""
        self.requests.add(record)
        if self.requests.due and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.ensure_future(asyncio.to_thread(self.requests.flush))

    async def flush(self) -> None:
        """Write everything kept so far (after a batch flush still in flight)."""
        if self._flushing is not None:
            await asyncio.shield(self._flushing)
        await asyncio.to_thread(self.requests.flush)
        await asyncio.to_thread(self.metrics.flush)
        self.save_manifest()

    def finish(self) -> None:
        """The last, synchronous write (also after an interrupt)."""
        self.requests.flush()
        self.metrics.flush()
        self.save_manifest()


class _Replay:
    """One replay while it runs: the plan, the blocks, warm-ups, counters and progress."""

    def __init__(self, scenario: Scenario, opts: ReplayOptions, target: Target) -> None:
        self.scenario = scenario
        self.opts = opts
        self.target = target
        self.run_id = opts.run_id or io.new_run_id(scenario.name)
        self.salt = os.urandom(6).hex()
        # Lags over 1 ms are kept; a request is flagged only where they matter to its TTFT
        # (runner.lag_matters), and nothing is logged mid-run for each lag.
        self.lag = LagMonitor(threshold_s=STALL_S, warn=False)
        self.t0 = time.perf_counter_ns()
        self.generator = generator_for(
            scenario.model.tokenizer, server_url=target.tokenizer_url(), model=scenario.model.name
        )
        self._builder: SessionBuilder | None = None
        self._progress: BlockProgress | None = None
        # The sessions first (a trace is read and checked here): a scenario refused on
        # its sessions leaves no run folder behind.
        first = self.builder(self.salt)
        self.run_dir = ensure_dir(opts.runs_dir) / self.run_id
        try:
            self.run_dir.mkdir()
        except OSError as exc:
            raise output_error(self.run_dir, exc) from None
        self.result = ReplayResult(self.run_dir)
        manifest = run_head(
            scenario,
            run_id=self.run_id,
            salt=self.salt,
            tokenizer=first.tokenizer.identity,
            text_generator=first.generator.identity,
            target={},
        )
        self.recorder = _Recorder(self.run_dir, manifest, self.lag)
        target.attach(self.run_dir)

    @property
    def manifest(self) -> Manifest:
        return self.recorder.manifest

    def builder(self, salt: str) -> SessionBuilder:
        """The sessions for ``salt``; texts are kept while blocks share the salt.

        Only the current salt's builder is kept: targets that cannot restart give every
        block its own salt, and holding each block's texts would grow with the run.
        """
        if self._builder is None or self._builder.salt != salt:
            self._builder = SessionBuilder(self.scenario, salt, self.generator)
        return self._builder

    async def main(self) -> None:
        self.manifest["target"] = self.target.describe()
        self.recorder.save_manifest()
        plan = plan_blocks(self.scenario, self.target.runnable_blocks(self.scenario.design.blocks))
        self.manifest["block_order"] = block_order(plan)
        lag_task = asyncio.create_task(self.lag.run())
        driver = self.scenario.driver
        client = Client(driver.concurrency, driver.connect_timeout_s)
        try:
            for block, following in zip(plan, [*plan[1:], None], strict=True):
                await self.run_block(client, block, following.cache if following else None)
            self.manifest["complete"] = True
        finally:
            lag_task.cancel()
            await client.close()
            await self.target.close()
            self.manifest["target"] = self.target.describe()

    async def run_block(self, client: Client, plan: BlockPlan, next_cache: str | None) -> None:
        """One block from opening its replicas to closing them; ``next_cache`` (the arm of
        the block that follows) lets the target keep processes for a block of its arm."""
        salt = self.salt if self.target.restarts else f"{self.salt}-b{plan.block}"
        entry = block_entry(plan, salt=salt, status="interrupted")
        self.manifest["blocks"].append(entry)
        self.recorder.save_manifest()
        count = len(self.builder(salt).sessions())
        in_flight = load.in_flight(self.scenario, plan.level, count)
        try:
            urls = await self.target.open_block(plan.cache)
            gateway = await self.open_gateway(plan)
            for url in [*urls, *([gateway] if gateway else [])]:
                # no measured request pays for connection setup
                await client.prewarm(url, min(in_flight, 256))
        except EndpointError as exc:
            # Replicas that cannot start fail this block only; the next one starts afresh.
            entry["status"], entry["error"], entry["ended_at"] = "failed", str(exc), io.now_iso()
            self.result.failures["block_start_failed"] += 1
            self.recorder.save_manifest()
            return
        await self.check_arm(plan, entry, urls)
        ctx = runner.BlockContext(
            scenario=self.scenario,
            client=client,
            urls=tuple(urls),
            plan=plan,
            run_id=self.run_id,
            t0_ns=self.t0,
            time_scale=self.target.time_scale,
            lag=self.lag,
            emit=self.on_record,
            gateway=gateway,
            served_by=self.target.served_by,
            modeled_arrivals=self.target.simulated and self.opts.workers <= 1,
        )
        try:
            await self.snapshot_all(ctx, "before")
            sessions = self.builder(salt).sessions()
            # Build every session's texts before any request is timed, off the loop.
            await asyncio.to_thread(lambda: [s.texts() for s in sessions])
            await self.warmup(ctx, salt)
            self._progress = BlockProgress(
                sum(s.turns for s in sessions),
                f"[block {plan.block}] {plan.placement}{self._level_text(plan)} cache={plan.cache}",
                enabled=self.opts.progress,
                time_scale=self.target.time_scale,
                unit=RunMeta.from_manifest(self.manifest).seconds,
            )
            scraper = asyncio.create_task(self.scrape(ctx))
            try:
                if self.opts.workers > 1:
                    entry["workers"] = await workers.run_in_workers(
                        ctx, salt, [s.index for s in sessions], self.opts.workers, self.on_record
                    )
                else:
                    await runner.run_sessions(ctx, sessions)
            finally:
                scraper.cancel()
                self._progress.close()
            await self.snapshot_all(ctx, "after")
            errors = self._progress.errors
            entry["status"], entry["errors"] = "failed" if errors else "ok", errors
        finally:
            entry["ended_at"] = io.now_iso()
            merge_facts(entry, await self.target.close_block(next_cache=next_cache))
            await self.recorder.flush()

    async def check_arm(self, plan: BlockPlan, entry: BlockEntry, urls: list[str]) -> None:
        """Stop the run before the block is sent when its replicas say the other arm
        (:mod:`.armcheck`): the block is recorded as failed with the evidence, closed,
        and a one-line :class:`EndpointError` ends the replay (exit status 2)."""
        evidence = arm_contradiction(
            plan.block, plan.placement, plan.cache, urls, self.target.connectors()
        )
        if evidence is None or self.scenario.target.allow_arm_mismatch:
            return
        entry["status"], entry["error"], entry["ended_at"] = "failed", evidence, io.now_iso()
        merge_facts(entry, await self.target.close_block())
        self.recorder.save_manifest()
        raise EndpointError(evidence)

    def _level_text(self, plan: BlockPlan) -> str:
        if len(load_levels(self.scenario)) == 1:
            return ""
        what = "concurrency" if self.scenario.load.arrival == "closed" else "rate"
        return f" {what}={plan.level:g}"

    async def scrape(self, ctx: runner.BlockContext, every_s: float = SCRAPE_EVERY_S) -> None:
        """Every replica's counters every ``every_s`` wall seconds while the block runs.

        Under load, requests to a replica overlap and counters read around one request
        are not its own; the series over time (moment ``during``) still shows how hits
        and queues evolve, and per-request hits come from the server where it says them.
        """
        while True:
            await asyncio.sleep(every_s)
            await self.snapshot_all(ctx, "during")

    async def open_gateway(self, plan: BlockPlan) -> str | None:
        """The block's router (routed placements), or None; the block is closed again
        when its router cannot start."""
        try:
            return await self.target.open_gateway(plan.placement)
        except BaseException:
            await self.target.close_block()
            raise

    async def snapshot_all(self, ctx: runner.BlockContext, moment: str) -> None:
        """Every replica's counters, kept as counter records."""
        http = ctx.client.http
        snaps = await asyncio.gather(*(counters.snapshot(http, u) for u in ctx.urls))
        t_s = (time.perf_counter_ns() - self.t0) / 1e9
        plan = ctx.plan
        for replica, snap in enumerate(snaps):
            for name, value in (snap or {}).items():
                self.recorder.metrics.add(
                    CounterRecord(
                        run_id=self.run_id,
                        block=plan.block,
                        placement=plan.placement,
                        cache=plan.cache,
                        replica=replica,
                        moment=moment,
                        metric=name,
                        value=value,
                        t_s=t_s,
                    )
                )

    def warmup_tokens(self) -> int:
        """Context length of each warm-up (:func:`~sessiongen.experiment.warmups.warmup_tokens`)."""
        return warmup_tokens(self.scenario.design.warmup_tokens, self.target.pool_chunk_tokens)

    async def warmup(self, ctx: runner.BlockContext, salt: str) -> None:
        """The block's warm-ups (:func:`~sessiongen.experiment.warmups.warmups`), one at a
        time; recorded, flagged, excluded from results. Counters are read around each
        (the records say whether the pool path was exercised); those through the router
        find their replica as routed turns do."""
        builder = self.builder(salt)
        tokens = self.warmup_tokens()
        http = ctx.client.http
        plan = ctx.plan
        rounds = self.scenario.design.warmup_requests
        req: TurnRequest | None = None
        for warm in warmups(
            block=plan.block, replicas=len(ctx.urls), rounds=rounds, routed=ctx.gateway is not None
        ):
            if req is None or req.session_id != f"warmup-{warm.key}":
                req = builder.warmup(warm.key, tokens)
            if warm.replica is None:
                res, served = await routing.send(ctx, req)
            else:
                url = ctx.urls[warm.replica]
                before = await counters.snapshot(http, url)
                res = await runner.send_turn(ctx, warm.replica, req)
                after = await counters.snapshot(http, url)
                served = routing.Served(warm.replica, "placement", before, after)
            facts = TurnFacts.of(
                req,
                warmup_placed(warm.hop),
                replica=served.replica,
                warmup=True,
                prompt_digest=req.prompt_digest(),
            )
            self.on_record(
                runner.record_of(
                    ctx,
                    facts,
                    res,
                    before=served.before,
                    after=served.after,
                    replica_source=served.source,
                )
            )

    def on_record(self, record: RequestRecord) -> None:
        """Keep a finished request's record; count it; move the progress bar."""
        self.recorder.add(record)
        if record.warmup:
            return
        self.result.requests += 1
        if record.status != "ok":
            self.result.failures[record.status] += 1
        if self._progress is not None:
            self._progress.update(record)

    def finalize(self, interrupted: bool) -> None:
        self.result.interrupted = interrupted
        self.manifest["ended_at"] = io.now_iso()
        if interrupted:
            self.manifest["complete"] = False
        self.recorder.finish()


def dry_run(scenario: Scenario, opts: ReplayOptions) -> list[str]:
    """The replay's plan, one line per block with what the target does to open it, and
    how salts are given; nothing is started, sent or written. Blocks are numbered from 0,
    as the manifest, the progress lines and the logs (``switch-0.log``, ``sim-0.log``)
    number them."""
    target = make_target(scenario, opts.endpoints, opts.cache)
    plan = plan_blocks(scenario, target.runnable_blocks(scenario.design.blocks))
    salts = (
        "one salt for the run (every block starts cold)"
        if target.restarts
        else "a fresh salt per block (the replicas cannot be restarted cold)"
    )
    lines = [f"target {target.kind}: {len(plan)} blocks, {salts}"]
    levels = len(load_levels(scenario)) > 1
    what = "concurrency" if scenario.load.arrival == "closed" else "rate"
    for b in plan:
        level = f" {what}={b.level:g}" if levels else ""
        lines.append(
            f"[block {b.block}] {b.placement}{level} cache={b.cache}: "
            f"{target.block_action(b.cache)}"
        )
    return lines


def replay(scenario: Scenario, opts: ReplayOptions) -> ReplayResult:
    """Run the whole replay; returns what it produced (also when interrupted)."""
    if opts.workers > 1 and scenario.driver.concurrency < max(2, opts.workers):
        raise UserError(
            f"--workers {opts.workers}: expected driver.concurrency >= {max(2, opts.workers)} "
            "(each worker needs a stream; concurrency 1 keeps per-request counters exact)"
        )
    if opts.workers > 1 and load.open_loop(scenario) and scenario.load.max_in_flight < opts.workers:
        raise UserError(
            f"--workers {opts.workers}: expected load.max_in_flight >= {opts.workers} "
            "(each worker runs a session at a time at least; max_in_flight = 1 keeps "
            "per-request counters exact)"
        )
    target = make_target(scenario, opts.endpoints, opts.cache)
    asyncio.run(target.preflight())  # a one-line error before any work or any run folder
    run = _Replay(scenario, opts, target)
    interrupted = False
    try:
        if opts.calibrate:
            # Loaded only when asked for: calibration's tails use the analysis stack
            # (scipy), which a replay (and each of its worker processes) need not import.
            from sessiongen.calibrate import calibrate, scenario_load

            run.manifest["calibration"] = calibrate(*scenario_load(scenario))
        signals.run(run.main())
    except KeyboardInterrupt:
        interrupted = True
    finally:
        with signals.deferred():  # a signal now waits until the run folder is written
            run.finalize(interrupted)
    return run.result
