"""Replay: run a scenario's sessions against a target, block by block, and record it all.

For each placement policy, the design's blocks run in order (default OFF, ON, ON, OFF),
each on freshly started replicas when the target allows it, each preceded by warm-up
requests of distinct content (recorded, flagged ``warmup``, excluded from results).
Sessions run concurrently up to ``driver.concurrency``; a session's turns run strictly
in order. Every request becomes a row of ``requests.parquet`` as it completes; each
replica's counters are read before and after every block (and around every request
when concurrency is 1, which makes per-request hit attribution exact).

A failed request stops its session (later prompts would build on a missing answer);
the run carries on. Ctrl-C stops cleanly and keeps everything measured so far.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from sessiongen.client import counters as metrics
from sessiongen.client import driver
from sessiongen.client.lagmon import LagMonitor
from sessiongen.errors import EndpointError, ScenarioError, UserError
from sessiongen.records import io as records
from sessiongen.replay import runner, workers
from sessiongen.scenario.spec import Scenario
from sessiongen.targets.base import EndpointsTarget, SimTarget, Target
from sessiongen.workload import textgen
from sessiongen.workload.sessions import SessionBuilder


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
class Outcome:
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


def make_target(scenario: Scenario, opts: ReplayOptions) -> Target:
    """The target named by ``--endpoints``/``--cache`` or the scenario's ``[target]``."""
    spec = scenario.target
    urls = opts.endpoints or (list(spec.endpoints) if spec.kind == "endpoints" else None)
    if urls:
        cache = opts.cache or spec.cache
        if cache not in ("on", "off"):
            raise UserError(
                "endpoints given: state which cache arm they are in with --cache on|off "
                "(or target.cache in the scenario)"
            )
        return EndpointsTarget(urls, cache, scenario.model.name)
    if spec.kind == "managed":
        from sessiongen.targets.managed import ManagedTarget

        return ManagedTarget(scenario)
    return SimTarget(scenario)


class _Run:
    """State of one replay while it runs."""

    def __init__(self, scenario: Scenario, opts: ReplayOptions, target: Target) -> None:
        self.scenario = scenario
        self.opts = opts
        self.target = target
        self.run_id = opts.run_id or records.new_run_id(scenario.name)
        self.run_dir = opts.runs_dir / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=False)
        self.salt = os.urandom(6).hex()
        self.requests = records.TableWriter(
            self.run_dir / "requests.parquet", records.REQUEST_SCHEMA, batch=32
        )
        self.metrics = records.TableWriter(
            self.run_dir / "metrics.parquet", records.METRICS_SCHEMA, batch=256
        )
        self.outcome = Outcome(self.run_dir)
        self._builder: SessionBuilder | None = None
        self._flushing: asyncio.Future[None] | None = None
        self._block_stats: dict[str, Any] = {"errors": 0, "ttft": []}
        self._bar: tqdm[Any] | None = None
        self.lag = LagMonitor()
        self.t0 = time.perf_counter_ns()
        urls = target.urls if isinstance(target, EndpointsTarget) else []
        self.generator = textgen.generator_for(
            scenario.model.tokenizer,
            server_url=urls[0] if urls else None,
            model=scenario.model.name,
        )
        first = self.builder(self.salt)
        self.manifest: dict[str, Any] = {
            "schema_version": records.SCHEMA_VERSION,
            "run_id": self.run_id,
            "scenario_name": scenario.name,
            "scenario_source": scenario.source,
            "scenario": scenario.to_dict(),
            "scenario_digest": scenario.digest(),
            "seed": scenario.seed,
            "salt": self.salt,
            **first.identity(),
            "tool": records.tool_identity(),
            "host": records.host_facts(),
            "target": {},
            "block_order": [],
            "blocks": [],
            "started_at": records.now_iso(),
            "ended_at": None,
            "complete": False,
        }

    def builder(self, salt: str) -> SessionBuilder:
        """The sessions for ``salt``; texts are kept while blocks share the salt.

        Only the current salt's builder is kept: targets that cannot restart give every
        block its own salt, and holding each block's texts would grow with the run.
        """
        if self._builder is None or self._builder.salt != salt:
            self._builder = SessionBuilder(self.scenario, salt, self.generator)
        return self._builder

    def save_manifest(self) -> None:
        self.manifest["loop_lag"] = self.lag.summary()
        records.write_manifest(self.run_dir, self.manifest)

    async def main(self) -> None:
        self.manifest["target"] = self.target.describe()
        self.save_manifest()
        plan = [
            (policy, i, cache)
            for policy in self.scenario.placement.policies
            for i, cache in enumerate(self.target.runnable_blocks(self.scenario.design.blocks))
        ]
        if not plan:
            raise ScenarioError(
                self.scenario.source, "design.blocks", "no block can run on this target's cache arm"
            )
        self.manifest["block_order"] = [{"placement": p, "cache": c} for p, _i, c in plan]
        lag_task = asyncio.create_task(self.lag.run())
        http = driver.new_client_session(
            self.scenario.driver.concurrency, self.scenario.driver.connect_timeout_s
        )
        try:
            for block, (policy, in_placement, cache) in enumerate(plan):
                await self.run_block(http, block, policy, in_placement, cache)
            self.manifest["complete"] = True
        finally:
            lag_task.cancel()
            await http.close()
            await self.target.close()
            self.manifest["target"] = self.target.describe()

    async def run_block(
        self, http: aiohttp.ClientSession, block: int, policy: str, in_placement: int, cache: str
    ) -> None:
        salt = self.salt if self.target.restarts else f"{self.salt}-b{block}"
        info: dict[str, Any] = {
            "block": block,
            "placement": policy,
            "cache": cache,
            "block_in_placement": in_placement,
            "salt": salt,
            "status": "interrupted",
            "started_at": records.now_iso(),
        }
        self.manifest["blocks"].append(info)
        self.save_manifest()
        try:
            urls = await self.target.open_block(cache)
            for url in urls:  # no measured request pays for connection setup
                await driver.prewarm(http, url, self.scenario.driver.concurrency)
        except EndpointError as exc:
            # Replicas that cannot start fail this block only; the next one starts afresh.
            info.update(status="failed", error=str(exc), ended_at=records.now_iso())
            self.outcome.failures["block_start_failed"] += 1
            self.save_manifest()
            return
        ctx = {
            "block": block,
            "block_in_placement": in_placement,
            "placement": policy,
            "cache": cache,
        }
        spec = runner.Block(
            self.scenario,
            http,
            urls,
            ctx,
            self.run_id,
            self.t0,
            self.target.time_scale,
            self.lag,
            self.on_row,
        )
        try:
            await self.snapshot_all(http, urls, ctx, "before")
            sessions = self.builder(salt).sessions()
            # Build every session's texts before any request is timed, off the loop.
            await asyncio.to_thread(lambda: [s.texts() for s in sessions])
            await self.warmup(spec, salt)
            self._block_stats = {"errors": 0, "ttft": []}
            self._bar = tqdm(
                total=len(sessions) * self.scenario.sessions.turns,
                desc=f"[{block + 1}] {policy} cache={cache}",
                unit="turn",
                disable=not self.opts.progress,
                leave=True,
            )
            if self.opts.workers > 1:
                info["workers"] = await workers.run_in_workers(
                    spec, salt, [s.index for s in sessions], self.opts.workers, self.on_row
                )
            else:
                await runner.run_sessions(spec, sessions, self.scenario.driver.concurrency)
            self._bar.close()
            await self.snapshot_all(http, urls, ctx, "after")
            errors = self._block_stats["errors"]
            info.update(status="failed" if errors else "ok", errors=errors)
        finally:
            info["ended_at"] = records.now_iso()
            info.update(await self.target.close_block())
            if self._flushing is not None:
                await asyncio.shield(self._flushing)
            await asyncio.to_thread(self.requests.flush)
            await asyncio.to_thread(self.metrics.flush)
            self.save_manifest()

    async def snapshot_all(
        self, http: aiohttp.ClientSession, urls: list[str], ctx: dict[str, Any], moment: str
    ) -> list[dict[str, float] | None]:
        snaps = await asyncio.gather(*(metrics.snapshot(http, u) for u in urls))
        for replica, snap in enumerate(snaps):
            for name, value in (snap or {}).items():
                self.metrics.add(
                    {
                        "run_id": self.run_id,
                        "block": ctx["block"],
                        "placement": ctx["placement"],
                        "cache": ctx["cache"],
                        "replica": replica,
                        "moment": moment,
                        "metric": name,
                        "value": value,
                    }
                )
        return list(snaps)

    async def warmup(self, block: runner.Block, salt: str) -> None:
        """Warm-up requests of distinct content; recorded, flagged, excluded from results.

        Each warm-up prompt runs on its replica and then again on the next one, so the
        path that serves a prefix from another replica (the shared pool, when on) is
        warm too: a fresh LMCache's first retrievals are several times slower.
        """
        builder = self.builder(salt)
        n = len(block.urls)
        for i in range(self.scenario.design.warmup_requests):
            for replica in range(n):
                req = builder.warmup(f"b{block.ctx['block']}-r{replica}-{i}")
                for hop, target in enumerate(dict.fromkeys([replica, (replica + 1) % n])):
                    res = await runner.send_turn(block, target, req)
                    row = runner.make_row(block, req, target, hop > 0, True, 0.0, res)
                    self.on_row(row)

    def _postfix(self, stats: dict[str, Any]) -> str:
        if not stats["ttft"]:
            return f"errors={stats['errors']}"
        med = statistics.median(stats["ttft"]) / self.target.time_scale
        unit = "modeled s" if self.target.simulated else "s"
        return f"errors={stats['errors']} median TTFT={med:.3f} {unit}"

    def on_row(self, row: dict[str, Any]) -> None:
        """Keep a finished request's row; count it; move the progress bar."""
        self.requests.add(row)
        if self.requests.due and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.ensure_future(asyncio.to_thread(self.requests.flush))
        if row["warmup"]:
            return
        self.outcome.requests += 1
        stats, bar = self._block_stats, self._bar
        if row["status"] != "ok":
            self.outcome.failures[row["status"]] += 1
            stats["errors"] += 1
        else:
            stats["ttft"].append(row["ttft_s"])
        if bar is not None:
            bar.update(1)
            if len(stats["ttft"]) % 8 == 1 or bar.n == bar.total or row["status"] != "ok":
                bar.set_postfix_str(self._postfix(stats))

    def finalize(self, interrupted: bool) -> None:
        self.outcome.interrupted = interrupted
        self.manifest["ended_at"] = records.now_iso()
        if interrupted:
            self.manifest["complete"] = False
        self.requests.flush()
        self.metrics.flush()
        self.save_manifest()


def replay(scenario: Scenario, opts: ReplayOptions) -> Outcome:
    """Run the whole replay; returns what it produced (also when interrupted)."""
    if opts.workers > 1 and scenario.driver.concurrency < max(2, opts.workers):
        raise UserError(
            f"--workers {opts.workers}: expected driver.concurrency >= {max(2, opts.workers)} "
            "(each worker needs a stream; concurrency 1 keeps per-request counters exact)"
        )
    target = make_target(scenario, opts)
    if isinstance(target, EndpointsTarget):
        asyncio.run(target.check())  # a one-line error before any work or any run folder
    run = _Run(scenario, opts, target)
    if opts.calibrate:
        from sessiongen.calibrate.measure import calibrate, scenario_load

        run.manifest["calibration"] = calibrate(*scenario_load(scenario))
    if hasattr(target, "log_dir"):
        target.log_dir = run.run_dir
    interrupted = False
    try:
        asyncio.run(run.main())
    except KeyboardInterrupt:
        interrupted = True
    finally:
        run.finalize(interrupted)
    return run.outcome
