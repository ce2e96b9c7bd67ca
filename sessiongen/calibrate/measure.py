"""Calibrate the client: how much time the driver itself adds to every TTFT it reports.

A reference server (:mod:`sessiongen.calibrate.refserver`), in its own process so it
never shares the driver's event loop, answers every streaming request after an exactly
known delay and then streams content chunks, one chunk per socket write, vLLM-shaped.
Its final usage chunk carries three stamps on the machine's monotonic clock: when the
request's last byte reached its socket (``server_rx_ns``, the kernel's receive time),
when it wrote the first content chunk (``server_tx_ns``), and the difference
(``server_ns``).

So for each request, with the client's ``send_ns`` and first-content timestamp ``t1``:

- added TTFT = (t1 - send_ns) - server_ns = upstream + downstream;
- upstream = rx - send_ns: writing the request and pushing the body through loopback;
- downstream = t1 - tx: delivery, the client's wake-up, its loop, and SSE parsing.

Two load shapes, reported apart because they answer different questions:

- *steady state* (the headline): ``concurrency`` closed-loop streams, started evenly
  spread over one request cycle, each sending its next request when the last ends;
- *burst*: ``concurrency`` requests released at the same instant, all bodies pushed
  through one loopback at once: mostly the bandwidth of loopback and the queueing of
  two event loops, an upper bound for the first instant of a run.

The stream rate is the client's capacity to parse chunks: content chunks per second
of the client's own CPU time while the server streams one chunk per write, paced so
that each socket read brings about one chunk (flat out, reads batch hundreds of chunks
and the per-chunk cost looks several times smaller than it is).

The machine may be shared: a lag monitor with 1 ms ticks tells stalls spent waiting
for a CPU (neighbours) from the client's own, and the p99 is also given without the
requests the former reached into. Both are reported; neither is hidden.

Tails are told as everywhere else (:mod:`sessiongen.analysis.tails`): the p90 and p99
are MLPerf LoadGen's early-stopping estimates, conservative values the true percentile
lies below with 99% confidence, and None where the sample is too small for one (64
requests for a p90, 662 for a p99); each comes with its sample count
(``requests``, ``requests_own``, ``burst_requests``). :mod:`.verdict` turns the figures
into the answer: what the client adds, and above which TTFT that is under 1% and 2%.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

from sessiongen.analysis.tails import tail
from sessiongen.calibrate.refserver import (
    CHUNKS_HEADER,
    DELAY_HEADER,
    INTERVAL_HEADER,
    ReferenceServer,
)
from sessiongen.calibrate.verdict import verdict
from sessiongen.client import http1
from sessiongen.client.driver import CHAT_PATH, Client, Result, serialize
from sessiongen.client.lagmon import STALL_S, LagMonitor
from sessiongen.scenario.spec import Scenario

BYTES_PER_TOKEN = 4.3  # JSON body bytes per prompt token (English prose, cl100k)


# Measuring -----------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of already sorted values.

    Nearest rank (Hyndman & Fan 1996, definition 1): the smallest value with at least
    q% of the sample at or below it; always an observed value, so p99 of 64 samples is
    the 64th, not an interpolation towards a value never seen. NaN for no values.
    """
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def request_body(body_bytes: int) -> bytes:
    """A chat request body of ``body_bytes`` bytes (at least its JSON frame), prose-like."""
    frame = serialize(
        {"model": "ref", "messages": [{"role": "user", "content": ""}], "stream": True}
    )
    phrase = "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod. "
    need = max(0, body_bytes - len(frame))
    filler = (phrase * (need // len(phrase) + 1))[:need]
    return serialize(
        {"model": "ref", "messages": [{"role": "user", "content": filler}], "stream": True}
    )


def tail_ms(values: Sequence[float], p: float) -> float | None:
    """The early-stopping estimate of the ``p``-quantile of independent ``values``
    (:func:`sessiongen.analysis.tails.tail`), None where they are too few for one."""
    return tail(values, p).bound


class _DelayedConn(http1.Conn):
    """A connection that waits a planted delay before writing each request.

    Inside the timed span (after ``send_ns``), so a calibration with a planted delay
    must report it as added TTFT: the self-check of the method.
    """

    delay_s = 0.0

    async def write(self, head: bytes, body: Sequence[http1.Buffer]) -> None:
        await asyncio.sleep(self.delay_s)
        await super().write(head, body)


def _client(concurrency: int, injected_delay_s: float) -> Client:
    """A client whose connections plant ``injected_delay_s`` before every request."""
    if not injected_delay_s:
        return Client(concurrency, 30.0)
    conn_class = type("DelayedConn", (_DelayedConn,), {"delay_s": injected_delay_s})
    pool = http1.Pool(concurrency + 8, connect_timeout_s=30.0, conn_class=conn_class)
    return Client(concurrency, 30.0, pool=pool)


def _monitor() -> LagMonitor:
    """A fine-grained lag monitor for calibration: 1 ms ticks, stalls over 1 ms kept.

    Finer than a replay's (5 ms) so that short stalls spent waiting for a CPU, which a
    shared machine's neighbours cause, are seen and told apart from the client's own.
    """
    return LagMonitor(interval_s=0.001, threshold_s=STALL_S, warn=False)


def _breakdown(results: Sequence[Result], lag: LagMonitor) -> dict[str, float | None]:
    """Added TTFT, upstream and downstream percentiles (ms) of measured requests."""
    added: list[float] = []
    clean: list[float] = []  # requests no stall of waiting for a CPU reached into
    up: list[float] = []
    down: list[float] = []
    flagged = failed = 0
    for res in results:
        stamps = res.usage_chunk or {}
        if not res.ok or "server_ns" not in stamps or not res.chunk_ns:
            failed += 1
            continue
        first = res.chunk_ns[0]
        added.append((first - res.send_ns - stamps["server_ns"]) / 1e6)
        up.append((stamps["server_rx_ns"] - res.send_ns) / 1e6)
        down.append((first - stamps["server_tx_ns"]) / 1e6)
        flagged += lag.lag_flag(res.send_ns, first)
        if not lag.flagged(res.send_ns, first, preempted_only=True):
            clean.append(added[-1])
    added.sort()
    clean.sort()
    up.sort()
    down.sort()
    return {
        "requests": len(added),
        "failed": failed,
        "added_ttft_p50_ms": percentile(added, 50),
        "added_ttft_p90_ms": tail_ms(added, 0.90),
        "added_ttft_p99_ms": tail_ms(added, 0.99),
        "added_ttft_max_ms": added[-1] if added else math.nan,
        "added_ttft_p99_own_ms": tail_ms(clean, 0.99),
        "added_ttft_max_own_ms": clean[-1] if clean else math.nan,
        "requests_own": len(clean),
        "upstream_p50_ms": percentile(up, 50),
        "upstream_p99_ms": tail_ms(up, 0.99),
        "upstream_max_ms": up[-1] if up else math.nan,
        "downstream_p50_ms": percentile(down, 50),
        "downstream_p99_ms": tail_ms(down, 0.99),
        "downstream_max_ms": down[-1] if down else math.nan,
        "lag_flagged": flagged,
        "lag_max_ms": lag.max_ns / 1e6,
        "lag_stalls": len(lag.events),
        "lag_preempted": lag.preempted,
    }


async def measure_burst(
    url: str,
    *,
    concurrency: int,
    body_bytes: int,
    rounds: int = 3,
    delay_s: float = 0.05,
    injected_delay_s: float = 0.0,
) -> dict[str, float | None]:
    """``rounds`` waves of ``concurrency`` requests released at the same instant."""
    body = request_body(body_bytes)
    headers = {DELAY_HEADER: str(delay_s), CHUNKS_HEADER: "4"}
    lag = _monitor()
    lag_task = asyncio.create_task(lag.run())
    results: list[Result] = []
    async with _client(concurrency, injected_delay_s) as client:
        await client.prewarm(url, concurrency)
        for _ in range(rounds):
            results += await asyncio.gather(
                *(
                    client.send(url + CHAT_PATH, body, headers=headers, timeout_s=60.0)
                    for _ in range(concurrency)
                )
            )
    lag_task.cancel()
    return {"body_bytes": len(body), **_breakdown(results, lag)}


async def measure_steady(
    url: str,
    *,
    concurrency: int,
    body_bytes: int,
    duration_s: float = 5.0,
    delay_s: float = 0.05,
    chunks: int = 20,
    interval_s: float = 0.01,
    injected_delay_s: float = 0.0,
) -> dict[str, float | None]:
    """``concurrency`` closed-loop streams, started spread over one request cycle.

    Each stream sends its next request as soon as the previous one ends (its first
    request, which meets a cold server path, is not counted) for ``duration_s``.
    The server answers after ``delay_s`` and streams ``chunks`` chunks ``interval_s``
    apart, so streams keep arriving at staggered moments as in a replay.
    """
    body = request_body(body_bytes)
    headers = {
        DELAY_HEADER: str(delay_s),
        CHUNKS_HEADER: str(chunks),
        INTERVAL_HEADER: str(interval_s),
    }
    cycle = delay_s + chunks * interval_s
    lag = _monitor()
    results: list[Result] = []

    async def stream(client: Client, k: int, stop_at: float) -> None:
        await asyncio.sleep(cycle * k / concurrency)
        first = True
        while time.perf_counter() < stop_at:
            res = await client.send(url + CHAT_PATH, body, headers=headers, timeout_s=60.0)
            if not first:
                results.append(res)
            first = False

    async with _client(concurrency, injected_delay_s) as client:
        await client.prewarm(url, concurrency)
        lag_task = asyncio.create_task(lag.run())
        stop_at = time.perf_counter() + cycle + duration_s
        await asyncio.gather(*(stream(client, k, stop_at) for k in range(concurrency)))
        lag_task.cancel()
    return {"body_bytes": len(body), **_breakdown(results, lag)}


async def measure_stream_rate(
    url: str, *, streams: int = 32, chunks: int = 1500, interval_s: float = 0.001
) -> dict[str, float]:
    """How fast the client parses chunks while the server streams one per write.

    ``streams`` streams of ``chunks`` chunks, ``interval_s`` apart on each stream (0:
    as fast as the server can write). ``chunks_per_cpu_s``, content chunks per second
    of this process's CPU time, is the client's capacity on one core: the largest
    rate it can sustain. ``chunks_per_read`` says how honest that is: near 1, every
    chunk paid for its own socket read and wake-up; well above 1 (flat out, with the
    client behind), reads were batched and the figure flatters the client.
    ``chunks_per_s`` is what the wall clock saw, which on a shared machine also
    depends on the server and the neighbours.
    """
    body = request_body(1000)
    headers = {DELAY_HEADER: "0", CHUNKS_HEADER: str(chunks), INTERVAL_HEADER: str(interval_s)}
    async with Client(streams, 30.0) as client:
        await client.prewarm(url, streams)
        wall, cpu = time.perf_counter(), time.process_time()
        results = await asyncio.gather(
            *(client.send(url + CHAT_PATH, body, headers=headers) for _ in range(streams))
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    got = sum(len(r.chunk_ns) for r in results if r.ok)
    reads = sum(r.reads for r in results if r.ok)
    return {
        "streams": streams,
        "interval_ms": interval_s * 1e3,
        "chunks": got,
        "chunks_per_s": got / wall,
        "chunks_per_cpu_s": got / cpu if cpu > 0 else math.nan,
        "chunks_per_read": got / reads if reads else math.nan,
    }


async def calibrate_at(
    url: str,
    concurrency: int,
    body_bytes: int,
    *,
    duration_s: float = 5.0,
    burst_rounds: int = 3,
    delay_s: float = 0.05,
    chunks: int = 20,
    interval_s: float = 0.01,
    injected_delay_s: float = 0.0,
    rate_streams: int = 32,
    rate_chunks: int = 1500,
) -> dict[str, float | str | None]:
    """:func:`calibrate` against a reference server already running at ``url``."""
    steady = await measure_steady(
        url,
        concurrency=concurrency,
        body_bytes=body_bytes,
        duration_s=duration_s,
        delay_s=delay_s,
        chunks=chunks,
        interval_s=interval_s,
        injected_delay_s=injected_delay_s,
    )
    burst = await measure_burst(
        url,
        concurrency=concurrency,
        body_bytes=body_bytes,
        rounds=burst_rounds,
        delay_s=delay_s,
        injected_delay_s=injected_delay_s,
    )
    rate = await measure_stream_rate(url, streams=rate_streams, chunks=rate_chunks)
    out: dict[str, float | str | None] = {
        "method": "reference server in its own process; added TTFT = client TTFT minus the "
        "server's own time from the last body byte's kernel receive time to its write of "
        "the first chunk; steady: closed-loop streams spread over a request cycle",
        "concurrency": concurrency,
        "body_bytes": steady["body_bytes"],
        "server_delay_ms": delay_s * 1e3,
        "steady_chunks": chunks,
        "steady_chunk_interval_ms": interval_s * 1e3,
        "steady_duration_s": duration_s,
        "burst_rounds": burst_rounds,
    }
    out.update({k: v for k, v in steady.items() if k != "body_bytes"})
    out.update({f"burst_{k}": v for k, v in burst.items() if k != "body_bytes"})
    out.update({f"stream_{k}": v for k, v in rate.items()})
    out["verdict"] = verdict(out)
    return out


def calibrate(concurrency: int, body_bytes: int, **kwargs: Any) -> dict[str, float | str | None]:
    """Measure the driver's own overhead at a scenario's load; figures for the manifest.

    Starts the reference server, runs the steady-state, burst and stream-rate
    measurements (keyword arguments as for :func:`calibrate_at`; about 10 s with the
    defaults) and returns a flat dict, one scalar per key (milliseconds unless named):

    - ``verdict``: the answer in one sentence (:func:`.verdict.verdict`);
    - ``added_ttft_p50_ms``, ``_p90_ms``, ``_p99_ms``, ``_max_ms``: steady state, the
      headline, over ``requests`` requests; the p90 and p99 are early-stopping
      estimates, None below 64 and 662 requests (module docstring);
    - ``added_ttft_p99_own_ms``: p99 over the ``requests_own`` requests that no stall
      spent waiting for a CPU reached into: the client's own tail, without its
      neighbours';
    - ``upstream_*``, ``downstream_*``: where the added time goes (see the module);
    - ``lag_max_ms``, ``lag_stalls`` (over 1 ms), ``lag_preempted`` (of those, spent
      mostly waiting for a CPU), ``lag_flagged`` (requests lag-flagged: stalls over 2%
      of their TTFT);
    - ``burst_*``: the same with every request released at once;
    - ``stream_chunks_per_cpu_s``: the largest sustainable stream rate on one core
      (``stream_chunks_per_read`` near 1 says it was not flattered by batched reads);
    - the load it was measured at (``concurrency``, ``body_bytes``, ...) and
      ``failed``/``burst_failed`` counts.

    Runs its own event loop: call it outside one (or await :func:`calibrate_at`).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("calibrate() runs its own event loop: await calibrate_at() instead")
    with ReferenceServer() as server:
        return asyncio.run(calibrate_at(server.url, concurrency, body_bytes, **kwargs))


def scenario_load(scenario: Scenario) -> tuple[int, int]:
    """(concurrency, body bytes) a scenario puts on the driver, for :func:`calibrate`.

    Concurrency is ``driver.concurrency``, capped at the number of sessions of one arm
    (more never run at once). Body bytes are those of the largest turn-1 request:
    about :data:`BYTES_PER_TOKEN` bytes per token of shared prefix, context and
    question, plus the JSON around them.
    """
    spec = scenario.sessions
    sessions = spec.count * len(spec.initial_context_tokens)
    concurrency = max(1, min(scenario.driver.concurrency, sessions))
    tokens = spec.shared_prefix_tokens + max(spec.initial_context_tokens) + spec.question_tokens
    return concurrency, int(tokens * BYTES_PER_TOKEN) + 300
