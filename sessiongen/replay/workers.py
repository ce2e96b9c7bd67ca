"""``replay --workers N``: one block's sessions spread over N processes, each its own loop.

One event loop can keep its timestamps honest up to a few hundred concurrent streams
(see ``sessiongen calibrate``); beyond that, its own work delays the reads it times.
The parent keeps everything else of the block (replicas, counters, warm-ups, records,
progress); worker k runs the sessions whose index is k mod N with its share of the
concurrency, using the same code as the parent's loop (:mod:`sessiongen.replay.runner`).

- Each worker builds its own sessions' texts (the same scenario, salt and seed give the
  same bytes), opens its connections, reports ready, and waits; all start together.
- Records come back over a queue as each request finishes, so the progress bar moves
  and the records are written as in a single-process run; ``send_s`` is measured against
  the parent's start on the system-wide monotonic clock.
- Each worker runs its own event-loop lag monitor and flags its own records.
- A worker exits as soon as its parent does, however the parent ended (SIGKILL
  included): it watches the parent's sentinel, so no worker outlives the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import queue as queue_mod
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sessiongen.client.driver import Client
from sessiongen.client.lagmon import STALL_S, LagMonitor
from sessiongen.design.blocks import BlockPlan
from sessiongen.errors import SessiongenError
from sessiongen.records.format import RequestRecord
from sessiongen.replay.runner import BlockContext, run_sessions
from sessiongen.scenario.spec import Scenario, from_dict
from sessiongen.targets.base import ServedBy
from sessiongen.workload.sessions import Session, SessionBuilder
from sessiongen.workload.textgen import generator_for

Message = tuple[str, int, Any]  # (kind, worker, data): ready | record | done | error


class WorkerError(SessiongenError):
    """A worker process failed before or while running its sessions."""


@dataclass(frozen=True)
class WorkerJob:
    """What one worker process needs (plain, picklable data)."""

    worker: int
    scenario: dict[str, Any]  # Scenario.to_dict(), rebuilt in the worker
    source: str
    salt: str
    urls: tuple[str, ...]
    plan: BlockPlan
    run_id: str
    t0_ns: int
    time_scale: float
    concurrency: int
    indices: tuple[int, ...]
    gateway: str | None = None
    served_by: ServedBy = ServedBy()


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """Concurrency per worker, as even as possible (each at least 1)."""
    return [
        concurrency // workers + (1 if k < concurrency % workers else 0) for k in range(workers)
    ]


def _exit_with_parent() -> None:
    """Exit this process when its parent has (the sentinel becomes ready when it dies)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_main(job: WorkerJob, out: Any, go: Any) -> None:
    """Entry point of one worker (a spawned process)."""
    _exit_with_parent()
    try:
        sc = from_dict(job.scenario, job.source)
        server = job.urls[0] if job.urls else job.gateway
        gen = generator_for(sc.model.tokenizer, server_url=server, model=sc.model.name)
        mine = set(job.indices)
        sessions = [s for s in SessionBuilder(sc, job.salt, gen).sessions() if s.index in mine]
        for s in sessions:
            s.texts()
        out.put(("ready", job.worker, None))
        go.wait()
        lag = asyncio.run(_run(sc, job, sessions, out))
        out.put(("done", job.worker, lag))
    except BaseException as exc:  # reported to the parent, which decides
        out.put(("error", job.worker, f"{type(exc).__name__}: {exc}"))


async def _run(sc: Scenario, job: WorkerJob, sessions: list[Session], out: Any) -> dict[str, Any]:
    lag = LagMonitor(threshold_s=STALL_S, warn=False)
    lag_task = asyncio.create_task(lag.run())
    async with Client(job.concurrency, sc.driver.connect_timeout_s) as client:
        for url in [*job.urls, *([job.gateway] if job.gateway else [])]:
            await client.prewarm(url, job.concurrency)
        ctx = BlockContext(
            scenario=sc,
            client=client,
            urls=job.urls,
            plan=job.plan,
            run_id=job.run_id,
            t0_ns=job.t0_ns,
            time_scale=job.time_scale,
            lag=lag,
            emit=lambda record: out.put(("record", job.worker, record)),
            gateway=job.gateway,
            served_by=job.served_by,
        )
        await run_sessions(ctx, sessions, job.concurrency)
    lag_task.cancel()
    return lag.summary()


async def run_in_workers(
    ctx: BlockContext,
    salt: str,
    session_indices: list[int],
    workers: int,
    on_record: Callable[[RequestRecord], None],
) -> list[dict[str, Any]]:
    """Run a block's sessions in ``workers`` processes; records go to ``on_record``.

    Returns each worker's lag summary. Raises :class:`WorkerError` when a worker fails
    before it starts; one that fails mid-block is recorded in its summary.
    """
    mpctx = mp.get_context("spawn")
    out = mpctx.Queue()
    go = mpctx.Event()
    # Never more streams than sessions: an open loop's cap (load.max_in_flight, 100,000 by
    # default) would otherwise have each worker open that many connections before it starts.
    shares = split_concurrency(min(ctx.concurrency, max(len(session_indices), workers)), workers)
    base = WorkerJob(
        worker=0,
        scenario=ctx.scenario.to_dict(),
        source=ctx.scenario.source,
        salt=salt,
        urls=ctx.urls,
        plan=ctx.plan,
        run_id=ctx.run_id,
        t0_ns=ctx.t0_ns,
        time_scale=ctx.time_scale,
        concurrency=1,
        indices=(),
        gateway=ctx.gateway,
        served_by=ctx.served_by,
    )
    procs = []
    for k in range(workers):
        job = replace(
            base,
            worker=k,
            concurrency=shares[k],
            indices=tuple(i for i in session_indices if i % workers == k),
        )
        procs.append(mpctx.Process(target=_worker_main, args=(job, out, go), daemon=True))
    try:
        for p in procs:
            p.start()
        for _ in range(workers):
            kind, k, data = await _next(out, procs)
            if kind == "error":
                raise WorkerError(f"worker {k} failed to start: {data}")
        go.set()
        summaries: list[dict[str, Any]] = [{} for _ in range(workers)]
        finished = 0
        while finished < workers:
            kind, k, data = await _next(out, procs)
            if kind == "record":
                on_record(data)
            else:
                summaries[k] = data if kind == "done" else {"error": data}
                finished += 1
        return summaries
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)


async def _next(out: Any, procs: list[Any]) -> Message:
    """The next message, without blocking the loop; fails if every worker died silently."""
    loop = asyncio.get_running_loop()
    while True:
        with contextlib.suppress(queue_mod.Empty):
            msg: Message = await loop.run_in_executor(None, out.get, True, 0.5)
            return msg
        if not any(p.is_alive() for p in procs):
            raise WorkerError("every worker process exited without reporting")
