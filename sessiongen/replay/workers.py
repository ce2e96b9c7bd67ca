"""``replay --workers N``: one block's sessions spread over N processes, each its own loop.

One event loop can keep its timestamps honest up to a few hundred concurrent streams
(see ``sessiongen calibrate``); beyond that, its own work delays the reads it times.
The parent keeps everything else of the block (replicas, counters, warm-ups, records,
progress); worker k runs the sessions whose index is k mod N with its share of the
concurrency, using the same code as the parent's loop (:mod:`sessiongen.replay.runner`).

- Each worker builds its own sessions' texts (the same scenario, salt and seed give the
  same bytes), opens its connections, reports ready, and waits; all start together.
- Rows come back over a queue as each request finishes, so the progress bar moves and
  the records are written as in a single-process run; ``send_s`` is measured against
  the parent's start on the system-wide monotonic clock.
- Each worker runs its own event-loop lag monitor and flags its own rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue as queue_mod
from collections.abc import Callable
from typing import Any

from sessiongen import scenario
from sessiongen.client import driver
from sessiongen.client.lagmon import LagMonitor
from sessiongen.errors import SessiongenError
from sessiongen.replay import runner
from sessiongen.workload import textgen
from sessiongen.workload.sessions import SessionBuilder

Message = tuple[str, int, Any]  # (kind, worker, data): ready | row | done | error


class WorkerError(SessiongenError):
    """A worker process failed before or while running its sessions."""


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """Concurrency per worker, as even as possible (each at least 1)."""
    return [
        concurrency // workers + (1 if k < concurrency % workers else 0) for k in range(workers)
    ]


def _worker_main(payload: dict[str, Any], out: Any, go: Any) -> None:
    """Entry point of worker ``payload['worker']`` (a spawned process)."""
    k = payload["worker"]
    try:
        sc = scenario.from_dict(payload["scenario"], payload["source"])
        gen = textgen.generator_for(
            sc.model.tokenizer, server_url=payload["urls"][0], model=sc.model.name
        )
        mine = set(payload["indices"])
        sessions = [
            s for s in SessionBuilder(sc, payload["salt"], gen).sessions() if s.index in mine
        ]
        for s in sessions:
            s.texts()
        out.put(("ready", k, None))
        go.wait()
        lag = asyncio.run(_run(sc, payload, sessions, out))
        out.put(("done", k, lag))
    except BaseException as exc:  # reported to the parent, which decides
        out.put(("error", k, f"{type(exc).__name__}: {exc}"))


async def _run(
    sc: scenario.Scenario, payload: dict[str, Any], sessions: list[Any], out: Any
) -> dict[str, Any]:
    k = payload["worker"]
    lag = LagMonitor()
    lag_task = asyncio.create_task(lag.run())
    async with driver.new_client_session(
        payload["concurrency"], sc.driver.connect_timeout_s
    ) as http:
        for url in payload["urls"]:
            await driver.prewarm(http, url, payload["concurrency"])
        block = runner.Block(
            sc,
            http,
            payload["urls"],
            payload["ctx"],
            payload["run_id"],
            payload["t0_ns"],
            payload["time_scale"],
            lag,
            lambda row: out.put(("row", k, row)),
        )
        await runner.run_sessions(block, sessions, payload["concurrency"])
    lag_task.cancel()
    return lag.summary()


async def run_in_workers(
    block: runner.Block,
    salt: str,
    session_indices: list[int],
    workers: int,
    on_row: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """Run a block's sessions in ``workers`` processes; rows go to ``on_row`` as they come.

    Returns each worker's lag summary. Raises :class:`WorkerError` when a worker fails
    before it starts; one that fails mid-block is recorded in its summary.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    shares = split_concurrency(block.scenario.driver.concurrency, workers)
    procs = []
    for k in range(workers):
        payload = {
            "worker": k,
            "scenario": block.scenario.to_dict(),
            "source": block.scenario.source,
            "salt": salt,
            "urls": block.urls,
            "ctx": block.ctx,
            "run_id": block.run_id,
            "t0_ns": block.t0_ns,
            "time_scale": block.time_scale,
            "concurrency": shares[k],
            "indices": [i for i in session_indices if i % workers == k],
        }
        procs.append(ctx.Process(target=_worker_main, args=(payload, out, go), daemon=True))
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
            if kind == "row":
                on_row(data)
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
