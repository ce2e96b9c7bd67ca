"""Calibrate the client: how much time the driver itself adds to every TTFT it reports.

A reference server, in its own process so it never shares the driver's event loop,
answers every streaming request after an exactly known delay and then streams content
chunks, one chunk per socket write, vLLM-shaped. It stamps the first content chunk
with three times on the machine's monotonic clock (the one ``perf_counter_ns`` reads
in every process on Linux):

- ``server_rx_ns``: when the last byte of the request body reached its socket, from
  the kernel's receive timestamp (``SO_TIMESTAMPNS``), so neither its own loop being
  busy with other connections nor its wake-up latency is charged to the client;
- ``server_tx_ns``: just before it wrote the first content chunk;
- ``server_ns`` = tx - rx: its own time to first chunk (the delay, plus any lateness).

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
"""

from __future__ import annotations

import asyncio
import math
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sessiongen.client import driver
from sessiongen.client.lagmon import LagMonitor

if TYPE_CHECKING:
    from sessiongen.scenario.spec import Scenario

DELAY_HEADER = "X-Ref-Delay-S"
CHUNKS_HEADER = "X-Ref-Chunks"
INTERVAL_HEADER = "X-Ref-Chunk-Interval-S"
BYTES_PER_TOKEN = 4.3  # JSON body bytes per prompt token (English prose, cl100k)
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_CHUNK_TEMPLATE = (
    b'{"id":"chatcmpl-ref","object":"chat.completion.chunk","created":0,"model":"ref",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}'
)


# The reference server ------------------------------------------------------------------


def _event(payload: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _event(b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}')
)
_PIECE = _event(_CHUNK_TEMPLATE)


def _tail(chunks: int) -> bytes:
    usage = b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}' % chunks
    return _event(usage) + _event(b"[DONE]") + b"0\r\n\r\n"


class _RefConn:
    """One connection of the reference server: read a request, answer it on schedule."""

    def __init__(self, server: _RefServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.head = bytearray()
        self.left = -1  # body bytes still to come; -1 while reading the head
        self.params = (0.05, 4, 0.0)
        self.out = bytearray()
        self.sent = 0
        self.total = 0
        self.closed = False

    def readable(self) -> None:
        srv = self.server
        while not self.closed:
            try:
                n, anc, _flags, _addr = self.sock.recvmsg_into([srv.buf], 64)
            except BlockingIOError:
                return
            except OSError:
                self.close()
                return
            if n == 0:
                self.close()
                return
            rx = _kernel_rx_ns(anc)
            self._consume(srv.view[:n], rx)

    def _consume(self, data: memoryview, rx: int) -> None:
        if self.left < 0:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > 65536:
                    self.close()
                return
            fields = _fields(bytes(self.head[:end]))
            have = len(self.head) - end - 4
            self.head.clear()
            self.params = (
                float(fields.get(DELAY_HEADER.lower(), "0.05")),
                int(fields.get(CHUNKS_HEADER.lower(), "4")),
                float(fields.get(INTERVAL_HEADER.lower(), "0")),
            )
            self.left = int(fields.get("content-length", "0")) - have
        else:
            self.left -= len(data)
        if self.left == 0:
            self.left = -1
            self._answer(rx)
        elif self.left < 0:
            self.close()  # more than the body (pipelining): not something clients send

    def _answer(self, rx: int) -> None:
        delay, chunks, interval = self.params
        self.total = chunks
        self.sent = 0
        self._write(_HEAD)
        wait = max(0.0, (rx + int(delay * 1e9) - time.perf_counter_ns()) / 1e9)
        self.server.loop.call_later(wait, self._first, rx, interval)

    def _first(self, rx: int, interval: float) -> None:
        if self.closed:
            return
        tx = time.perf_counter_ns()
        stamps = b',"server_ns":%d,"server_rx_ns":%d,"server_tx_ns":%d}' % (tx - rx, rx, tx)
        self._write(_event(_CHUNK_TEMPLATE[:-1] + stamps))
        self.sent = 1
        self._more(interval)

    def _more(self, interval: float) -> None:
        """Next chunks: one per write, paced, or flat out with a yield every few."""
        burst = 1 if interval else 16
        while not self.closed and self.sent < self.total and burst:
            if self.out:  # the socket is full: resume when it drains
                self.server.loop.call_later(0.0005, self._more, interval)
                return
            self._write(_PIECE)
            self.sent += 1
            burst -= 1
        if self.closed:
            return
        if self.sent < self.total:
            self.server.loop.call_later(interval, self._more, interval)
        else:
            self._write(_tail(self.total))

    def _write(self, data: bytes) -> None:
        if self.out:
            self.out += data
            return
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            self.close()
            return
        if n < len(data):
            self.out += data[n:]
            self.server.loop.add_writer(self.sock.fileno(), self._flush)

    def _flush(self) -> None:
        try:
            n = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        del self.out[:n]
        if not self.out:
            self.server.loop.remove_writer(self.sock.fileno())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            loop = self.server.loop
            loop.remove_reader(self.sock.fileno())
            loop.remove_writer(self.sock.fileno())
            self.sock.close()


def _fields(head: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


def _kernel_rx_ns(anc: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive time of the read's latest bytes, on the monotonic clock.

    The kernel stamps with the real-time clock; the offset to the monotonic clock is
    read right here, bracketed by two monotonic reads. Without a stamp (another OS),
    the time of the read itself.
    """
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            before = time.perf_counter_ns()
            real = time.time_ns()
            after = time.perf_counter_ns()
            return sec * 1_000_000_000 + nsec - (real - (before + after) // 2)
    return time.perf_counter_ns()


class _RefServer:
    """The reference server's listening socket and its connections, on one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A large receive buffer (inherited by accepted sockets) lets a whole body land in
        # the kernel while this loop is busy elsewhere: the upload is not throttled by the
        # reference server's own reading speed.
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        loop.add_reader(self.listener.fileno(), self._accept)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            conn = _RefConn(self, sock)
            self.loop.add_reader(sock.fileno(), conn.readable)


def serve_main() -> None:
    """Entry of the reference server process: print the port, serve until stdin closes."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = _RefServer(loop)
        stop: asyncio.Future[None] = loop.create_future()

        def stdin_readable() -> None:
            if not stop.done():
                stop.set_result(None)

        loop.add_reader(sys.stdin.fileno(), stdin_readable)
        print(f"PORT {server.port}", flush=True)
        await stop

    asyncio.run(main())


class ReferenceServer:
    """The reference server in a child process; a context manager with its ``url``."""

    def __init__(self) -> None:
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ReferenceServer:
        code = "from sessiongen.calibrate.measure import serve_main; serve_main()"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], 60)
        line = self._proc.stdout.readline().decode() if ready else ""
        if not line.startswith("PORT "):
            self.__exit__()
            raise RuntimeError(f"reference server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the server stops when its stdin closes
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        self._proc = None


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
    frame = driver.serialize(
        {"model": "ref", "messages": [{"role": "user", "content": ""}], "stream": True}
    )
    phrase = "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod. "
    need = max(0, body_bytes - len(frame))
    filler = (phrase * (need // len(phrase) + 1))[:need]
    return driver.serialize(
        {"model": "ref", "messages": [{"role": "user", "content": filler}], "stream": True}
    )


def _monitor() -> LagMonitor:
    """A fine-grained lag monitor for calibration: 1 ms ticks, stalls over 1 ms kept.

    Finer than a replay's (5 ms) so that short stalls spent waiting for a CPU, which a
    shared machine's neighbours cause, are seen and told apart from the client's own.
    """
    return LagMonitor(interval_s=0.001, threshold_s=0.001, warn=False)


def _breakdown(results: Sequence[driver.Result], lag: LagMonitor) -> dict[str, Any]:
    """Added TTFT, upstream and downstream percentiles (ms) of measured requests."""
    added: list[float] = []
    clean: list[float] = []  # requests no stall of waiting for a CPU reached into
    up: list[float] = []
    down: list[float] = []
    flagged = failed = 0
    for res in results:
        if not res.ok or res.server_ns is None or not res.chunk_ns:
            failed += 1
            continue
        first = res.chunk_ns[0]
        added.append((first - res.send_ns - res.server_ns) / 1e6)
        if res.server_rx_ns is not None and res.server_tx_ns is not None:
            up.append((res.server_rx_ns - res.send_ns) / 1e6)
            down.append((first - res.server_tx_ns) / 1e6)
        flagged += lag.flagged(res.send_ns, first)
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
        "added_ttft_p99_ms": percentile(added, 99),
        "added_ttft_max_ms": added[-1] if added else math.nan,
        "added_ttft_p99_own_ms": percentile(clean, 99),
        "requests_own": len(clean),
        "upstream_p50_ms": percentile(up, 50),
        "upstream_p99_ms": percentile(up, 99),
        "downstream_p50_ms": percentile(down, 50),
        "downstream_p99_ms": percentile(down, 99),
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
) -> dict[str, Any]:
    """``rounds`` waves of ``concurrency`` requests released at the same instant."""
    body = request_body(body_bytes)
    headers = {DELAY_HEADER: str(delay_s), CHUNKS_HEADER: "4"}
    lag = _monitor()
    lag_task = asyncio.create_task(lag.run())
    results: list[driver.Result] = []
    async with driver.new_client_session(concurrency, 30.0) as http:
        await driver.prewarm(http, url, concurrency)
        for _ in range(rounds):
            results += await asyncio.gather(
                *(
                    driver.send(
                        http,
                        url + driver.CHAT_PATH,
                        body,
                        extra_headers=headers,
                        pre_send_delay_s=injected_delay_s,
                        timeout_s=60.0,
                    )
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
) -> dict[str, Any]:
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
    results: list[driver.Result] = []

    async def stream(http: Any, k: int, stop_at: float) -> None:
        await asyncio.sleep(cycle * k / concurrency)
        first = True
        while time.perf_counter() < stop_at:
            res = await driver.send(
                http,
                url + driver.CHAT_PATH,
                body,
                extra_headers=headers,
                pre_send_delay_s=injected_delay_s,
                timeout_s=60.0,
            )
            if not first:
                results.append(res)
            first = False

    async with driver.new_client_session(concurrency, 30.0) as http:
        await driver.prewarm(http, url, concurrency)
        lag_task = asyncio.create_task(lag.run())
        stop_at = time.perf_counter() + cycle + duration_s
        await asyncio.gather(*(stream(http, k, stop_at) for k in range(concurrency)))
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
    async with driver.new_client_session(streams, 30.0) as http:
        await driver.prewarm(http, url, streams)
        wall, cpu = time.perf_counter(), time.process_time()
        results = await asyncio.gather(
            *(
                driver.send(http, url + driver.CHAT_PATH, body, extra_headers=headers)
                for _ in range(streams)
            )
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
) -> dict[str, Any]:
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
    out: dict[str, Any] = {
        "method": "reference server in its own process; added TTFT = client TTFT minus the "
        "server's own time from the last body byte's kernel receive time to its write of "
        "the first chunk; steady: closed-loop streams spread over a request cycle",
        "concurrency": concurrency,
        "body_bytes": steady["body_bytes"],
        "server_delay_ms": delay_s * 1e3,
        "steady_chunks": chunks,
        "steady_chunk_interval_ms": interval_s * 1e3,
    }
    out.update({k: v for k, v in steady.items() if k != "body_bytes"})
    out.update({f"burst_{k}": v for k, v in burst.items() if k != "body_bytes"})
    out.update({f"stream_{k}": v for k, v in rate.items()})
    return out


def calibrate(concurrency: int, body_bytes: int, **kwargs: Any) -> dict[str, Any]:
    """Measure the driver's own overhead at a scenario's load; figures for the manifest.

    Starts the reference server, runs the steady-state, burst and stream-rate
    measurements (keyword arguments as for :func:`calibrate_at`; about 10 s with the
    defaults) and returns a flat dict, one scalar per key (milliseconds unless named):

    - ``added_ttft_p50_ms``, ``_p99_ms``, ``_max_ms``: steady state, the headline;
    - ``added_ttft_p99_own_ms``: p99 over requests that no stall spent waiting for a
      CPU reached into: the client's own tail, without its neighbours';
    - ``upstream_*``, ``downstream_*``: where the added time goes (see the module);
    - ``lag_max_ms``, ``lag_stalls`` (over 1 ms), ``lag_preempted`` (of those, spent
      mostly waiting for a CPU), ``lag_flagged`` (requests a stall reached into);
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
