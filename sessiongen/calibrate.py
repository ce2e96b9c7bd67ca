"""Calibrate the client: how much time the driver itself adds to every TTFT it reports.

A reference server (its own process, so it does not share the driver's event loop)
answers every streaming request after an exactly known delay, then streams content
chunks at a known rate. Each first chunk carries ``server_ns``: the time the server
spent from the moment its handler had the request until it wrote that chunk. So

- ``added_ttft`` = client TTFT - server_ns: what the client, the loopback transport
  and request parsing add (body serialization happens before the clock starts);

measured at the scenario's concurrency with request bodies of the scenario's size.
The largest sustainable stream rate is measured by streaming many chunks with no
delay and counting chunks parsed per second of wall time.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from . import driver
from .lagmon import LagMonitor

DELAY_HEADER = "X-Ref-Delay-S"
CHUNKS_HEADER = "X-Ref-Chunks"
RATE_HEADER = "X-Ref-Chunk-Interval-S"


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _complete(request: web.Request) -> web.StreamResponse:
    start = time.perf_counter_ns()
    await request.read()
    delay = float(request.headers.get(DELAY_HEADER, "0.05"))
    chunks = int(request.headers.get(CHUNKS_HEADER, "4"))
    interval = float(request.headers.get(RATE_HEADER, "0"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    deadline = start + int(delay * 1e9)
    await asyncio.sleep(max(0.0, (deadline - time.perf_counter_ns()) / 1e9))
    server_ns = time.perf_counter_ns() - start
    first = {"choices": [{"index": 0, "delta": {"content": "x"}}], "server_ns": server_ns}
    await resp.write(_chunk(first))
    piece = _chunk({"choices": [{"index": 0, "delta": {"content": "y"}}]})
    for i in range(1, chunks):
        if interval:
            await asyncio.sleep(interval)
        # Batch writes when streaming flat out so the server is not the bottleneck.
        if interval or i % 64 == 0 or i == chunks - 1:
            await resp.write(piece * (1 if interval else min(64, chunks - i)))
    usage = {"prompt_tokens": 1, "completion_tokens": chunks}
    await resp.write(_chunk({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    return resp


def reference_app() -> web.Application:
    """The reference server's app (chat path only)."""
    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post(driver.CHAT_PATH, _complete)
    return app


def _serve(port_queue: Any) -> None:
    async def main() -> None:
        runner = web.AppRunner(reference_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port_queue.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


class ReferenceServer:
    """The reference server in a child process; a context manager yielding its URL."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._queue: Any = ctx.Queue()
        self._proc = ctx.Process(target=_serve, args=(self._queue,), daemon=True)
        self.url = ""

    def __enter__(self) -> ReferenceServer:
        self._proc.start()
        self.url = f"http://127.0.0.1:{self._queue.get(timeout=60)}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.join(10)


@dataclass
class Figures:
    """Added TTFT percentiles (ms), loop lag (ms) and stream rate (chunks/s)."""

    concurrency: int
    body_bytes: int
    requests: int
    added_p50_ms: float
    added_p99_ms: float
    added_max_ms: float
    loop_lag_max_ms: float
    failed: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _body(body_bytes: int) -> bytes:
    filler = "lorem " * (body_bytes // 6)
    return driver.serialize(
        {"model": "ref", "messages": [{"role": "user", "content": filler}], "stream": True}
    )


async def measure_added_ttft(
    url: str,
    *,
    concurrency: int,
    body_bytes: int,
    rounds: int = 3,
    delay_s: float = 0.05,
    injected_delay_s: float = 0.0,
) -> Figures:
    """Send ``rounds`` waves of ``concurrency`` streams; added TTFT = client - server time.

    ``injected_delay_s`` adds a known client-side delay before each send (inside the
    timed span), for tests that the calibration recovers it.
    """
    body = _body(body_bytes)
    headers = {DELAY_HEADER: str(delay_s), CHUNKS_HEADER: "4"}
    lag = LagMonitor()
    lag_task = asyncio.create_task(lag.run())
    added: list[float] = []
    failed = 0
    async with driver.new_client_session(concurrency, 30.0) as http:
        for _ in range(rounds):
            results = await asyncio.gather(
                *(
                    driver.send(
                        http,
                        url + driver.CHAT_PATH,
                        body,
                        extra_headers=headers,
                        pre_send_delay_s=injected_delay_s,
                    )
                    for _ in range(concurrency)
                )
            )
            for res in results:
                if not res.ok or res.ttft_s is None or res.server_ns is None:
                    failed += 1
                    continue
                added.append(res.ttft_s - res.server_ns / 1e9)
    lag_task.cancel()
    added.sort()
    return Figures(
        concurrency=concurrency,
        body_bytes=len(body),
        requests=len(added),
        added_p50_ms=statistics.median(added) * 1e3 if added else float("nan"),
        added_p99_ms=added[min(len(added) - 1, int(0.99 * len(added)))] * 1e3
        if added
        else float("nan"),
        added_max_ms=added[-1] * 1e3 if added else float("nan"),
        loop_lag_max_ms=lag.max_ns / 1e6,
        failed=failed,
    )


async def measure_stream_rate(url: str, *, chunks: int = 50_000, streams: int = 1) -> float:
    """Content chunks parsed per second of wall time, streaming flat out."""
    body = _body(1000)
    headers = {DELAY_HEADER: "0", CHUNKS_HEADER: str(chunks)}
    async with driver.new_client_session(streams, 30.0) as http:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(
                driver.send(http, url + driver.CHAT_PATH, body, extra_headers=headers)
                for _ in range(streams)
            )
        )
        elapsed = time.perf_counter() - start
    got = sum(len(r.chunk_ns) for r in results if r.ok)
    return got / elapsed
