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
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from . import driver, metrics, placement, records, textgen
from .errors import EndpointError, ScenarioError, UserError
from .lagmon import LagMonitor
from .scenario import Scenario
from .sessions import Session, SessionBuilder
from .targets import EndpointsTarget, SimTarget, Target


@dataclass
class ReplayOptions:
    """How to run a replay (everything not in the scenario)."""

    runs_dir: Path = Path("runs")
    endpoints: list[str] | None = None
    cache: str | None = None
    progress: bool = True
    run_id: str | None = None
    calibrate: bool = False  # measure the client's own overhead first (manifest: calibration)


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
        from .launch.target import ManagedTarget

        return ManagedTarget(scenario)
    return SimTarget(scenario)


def _first_number(text: str) -> str | None:
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


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
        self.builders: dict[str, SessionBuilder] = {}
        self._flushing: asyncio.Future[None] | None = None
        self.lag = LagMonitor()
        self.t0 = time.perf_counter_ns()
        self.api_path = (
            driver.CHAT_PATH if scenario.model.api == "chat" else driver.COMPLETIONS_PATH
        )
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
        if salt not in self.builders:
            self.builders[salt] = SessionBuilder(self.scenario, salt, self.generator)
        return self.builders[salt]

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
        try:
            await self.snapshot_all(http, urls, ctx, "before")
            sessions = self.builder(salt).sessions()
            # Build every session's texts before any request is timed, off the loop.
            await asyncio.to_thread(lambda: [s.request(1) for s in sessions])
            await self.warmup(http, urls, ctx, salt)
            bar = tqdm(
                total=len(sessions) * self.scenario.sessions.turns,
                desc=f"[{block + 1}] {policy} cache={cache}",
                unit="turn",
                disable=not self.opts.progress,
                leave=True,
            )
            block_stats = {"errors": 0, "ttft": []}
            sem = asyncio.Semaphore(self.scenario.driver.concurrency)
            tasks = [self.run_session(http, urls, ctx, s, sem, bar, block_stats) for s in sessions]
            await asyncio.gather(*tasks)
            bar.close()
            await self.snapshot_all(http, urls, ctx, "after")
            info["status"] = "failed" if block_stats["errors"] else "ok"
            info["errors"] = block_stats["errors"]
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

    async def warmup(
        self, http: aiohttp.ClientSession, urls: list[str], ctx: dict[str, Any], salt: str
    ) -> None:
        builder = self.builder(salt)
        for i in range(self.scenario.design.warmup_requests):
            for replica, url in enumerate(urls):
                req = builder.warmup(f"b{ctx['block']}-r{replica}-{i}")
                body = req.body_parts(self.scenario)
                res = await driver.send(
                    http,
                    url + self.api_path,
                    body,
                    timeout_s=self.scenario.driver.request_timeout_s,
                )
                self.record(ctx, req, replica, False, True, 0.0, res, None, None)

    async def run_session(
        self,
        http: aiohttp.ClientSession,
        urls: list[str],
        ctx: dict[str, Any],
        session: Session,
        sem: asyncio.Semaphore,
        bar: tqdm,
        stats: dict[str, Any],
    ) -> None:
        sc = self.scenario
        arrival = time.perf_counter_ns()
        exact_counters = sc.driver.concurrency == 1
        async with sem:
            queue_s = (time.perf_counter_ns() - arrival) / 1e9
            answers: list[str] = []
            prev: int | None = None
            for turn in range(1, session.turns + 1):
                replica = placement.replica_for(
                    ctx["placement"], session.index, turn, len(urls), sc.seed
                )
                req = session.request(turn, answers if sc.sessions.history == "live" else None)
                body = req.body_parts(sc)
                url = urls[replica]
                before = await metrics.snapshot(http, url) if exact_counters else None
                res = await driver.send(
                    http, url + self.api_path, body, timeout_s=sc.driver.request_timeout_s
                )
                after = await metrics.snapshot(http, url) if exact_counters else None
                cross = prev is not None and prev != replica
                self.record(ctx, req, replica, cross, False, queue_s, res, before, after)
                queue_s = 0.0
                bar.update(1)
                if not res.ok:
                    stats["errors"] += 1
                    bar.set_postfix_str(f"errors={stats['errors']}")
                    return
                stats["ttft"].append(res.ttft_s)
                if len(stats["ttft"]) % 8 == 1 or bar.n == bar.total:
                    bar.set_postfix_str(self._postfix(stats))
                answers.append(res.text)
                prev = replica
                if sc.sessions.think_time_s and turn < session.turns:
                    await asyncio.sleep(sc.sessions.think_time_s * self.target.time_scale)

    def _postfix(self, stats: dict[str, Any]) -> str:
        med = statistics.median(stats["ttft"]) / self.target.time_scale
        unit = "modeled s" if self.target.simulated else "s"
        return f"errors={stats['errors']} median TTFT={med:.3f} {unit}"

    def record(
        self,
        ctx: dict[str, Any],
        req: Any,
        replica: int,
        cross: bool,
        warmup: bool,
        queue_s: float,
        res: driver.Result,
        before: dict[str, float] | None,
        after: dict[str, float] | None,
    ) -> None:
        row = res.row()
        correct = None
        if req.expected is not None and res.ok:
            correct = _first_number(res.text) == req.expected
        row.update(
            {
                "run_id": self.run_id,
                "block": ctx["block"],
                "block_in_placement": ctx["block_in_placement"],
                "placement": ctx["placement"],
                "cache": ctx["cache"],
                "session_id": req.session_id,
                "session_index": req.session_index,
                "context_tokens": req.context_tokens,
                "turn": req.turn,
                "replica": replica,
                "cross_replica": cross,
                "warmup": warmup,
                "content_tokens": req.content_tokens,
                "queue_s": queue_s,
                "send_s": (res.send_ns - self.t0) / 1e9,
                "expected": req.expected,
                "answer_correct": correct,
                "local_hit_tokens": metrics.delta(before, after, metrics.LOCAL_HITS),
                "external_hit_tokens": metrics.delta(before, after, metrics.EXTERNAL_HITS),
                "loop_lag_flag": self.lag.flagged(res.send_ns, time.perf_counter_ns()),
            }
        )
        self.requests.add(row)
        if self.requests.due and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.ensure_future(asyncio.to_thread(self.requests.flush))
        if not warmup:
            self.outcome.requests += 1
            if not res.ok:
                self.outcome.failures[res.status] += 1

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
    target = make_target(scenario, opts)
    if isinstance(target, EndpointsTarget):
        asyncio.run(target.check())  # a one-line error before any work or any run folder
    run = _Run(scenario, opts, target)
    if opts.calibrate:
        from .calibrate import calibrate, scenario_load

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
