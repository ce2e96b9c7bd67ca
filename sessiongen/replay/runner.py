"""Run sessions' turns against replicas and turn each measured request into a record row.

Shared by replay's own event loop and by worker processes (``replay --workers N``): a
:class:`Block` says where the block's requests go and hands every finished request's
row to its ``emit`` callback (which records it, updates progress, or ships it to the
parent process).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from sessiongen.client import counters as metrics
from sessiongen.client import driver
from sessiongen.client.lagmon import LagMonitor
from sessiongen.replay import placement
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.sessions import Session, TurnRequest

Emit = Callable[[dict[str, Any]], None]


@dataclass
class Block:
    """One block's fixed facts and the callback that receives its rows."""

    scenario: Scenario
    http: aiohttp.ClientSession
    urls: list[str]
    ctx: dict[str, Any]  # block, block_in_placement, placement, cache
    run_id: str
    t0_ns: int  # perf_counter_ns of the run's start (system-wide monotonic on Linux)
    time_scale: float
    lag: LagMonitor
    emit: Emit

    @property
    def api_path(self) -> str:
        return driver.CHAT_PATH if self.scenario.model.api == "chat" else driver.COMPLETIONS_PATH

    @property
    def exact_counters(self) -> bool:
        """Counters around each request are exact only when requests never overlap."""
        return self.scenario.driver.concurrency == 1


def _first_number(text: str) -> str | None:
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


def make_row(
    block: Block,
    req: TurnRequest,
    replica: int,
    cross: bool,
    warmup: bool,
    queue_s: float,
    res: driver.Result,
    before: dict[str, float] | None = None,
    after: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A ``requests.parquet`` row for one finished request."""
    row = res.row()
    correct = None
    if req.expected is not None and res.ok:
        correct = _first_number(res.text) == req.expected
    ctx = block.ctx
    row.update(
        {
            "run_id": block.run_id,
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
            "send_s": (res.send_ns - block.t0_ns) / 1e9,
            "expected": req.expected,
            "answer_correct": correct,
            "local_hit_tokens": metrics.delta(before, after, metrics.LOCAL_HITS),
            "external_hit_tokens": metrics.delta(before, after, metrics.EXTERNAL_HITS),
            "loop_lag_flag": block.lag.flagged(res.send_ns, time.perf_counter_ns()),
        }
    )
    return row


async def send_turn(block: Block, replica: int, req: TurnRequest) -> driver.Result:
    """Send one request to ``replica`` and measure it."""
    return await driver.send(
        block.http,
        block.urls[replica] + block.api_path,
        req.body_parts(block.scenario),
        timeout_s=block.scenario.driver.request_timeout_s,
    )


async def run_session(block: Block, session: Session, sem: asyncio.Semaphore) -> None:
    """All turns of one session, strictly in order; stops at the first failed turn.

    The time the session waited for a concurrency slot is its first turn's ``queue_s``.
    """
    sc = block.scenario
    arrival = time.perf_counter_ns()
    async with sem:
        queue_s = (time.perf_counter_ns() - arrival) / 1e9
        answers: list[str] = []
        prev: int | None = None
        for turn in range(1, session.turns + 1):
            replica = placement.replica_for(
                block.ctx["placement"], session.index, turn, len(block.urls), sc.seed
            )
            req = session.request(turn, answers if sc.sessions.history == "live" else None)
            url = block.urls[replica]
            before = await metrics.snapshot(block.http, url) if block.exact_counters else None
            res = await send_turn(block, replica, req)
            after = await metrics.snapshot(block.http, url) if block.exact_counters else None
            cross = prev is not None and prev != replica
            block.emit(make_row(block, req, replica, cross, False, queue_s, res, before, after))
            queue_s = 0.0
            if not res.ok:
                return
            answers.append(res.text)
            prev = replica
            if sc.sessions.think_time_s and turn < session.turns:
                await asyncio.sleep(sc.sessions.think_time_s * block.time_scale)


async def run_sessions(block: Block, sessions: list[Session], concurrency: int) -> None:
    """Sessions concurrently, at most ``concurrency`` in flight."""
    sem = asyncio.Semaphore(concurrency)
    await asyncio.gather(*(run_session(block, s, sem) for s in sessions))
