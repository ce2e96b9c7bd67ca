"""The async streaming driver: one request, timed from the client's side.

Every timestamp comes from ``time.perf_counter_ns()`` taken first thing in the
protocol's ``data_received``, i.e. right after the ``recv`` that delivered the bytes,
before any parsing. Definitions (all wall seconds, from ``send_ns``: the moment the
connection is in hand and the request is about to be written; the body is serialized
before that and connection setup is timed apart in ``connect_s``):

- ``ttfb_s``: until the response status line and headers have arrived;
- ``ttft_s``: until the first SSE event whose delta has non-empty ``content`` (chat) or
  ``text`` (completions); reasoning deltas are counted apart and never end TTFT;
- ``e2e_s``: until ``data: [DONE]`` (or the end of the body);
- inter-token latencies: gaps between consecutive content deltas (``itl_p50_s``,
  ``itl_max_s``);
- server usage (prompt, completion, cached tokens) from the final usage chunk.

Faults become a status, never an exception: ``connect_error``, ``http_error``,
``stream_error`` (reset, malformed or truncated SSE), ``timeout`` (no bytes for
``request_timeout_s``), ``no_content``.

Why not aiohttp's request machinery: it timestamps only when the reading coroutine is
resumed (a loop iteration after the socket read, later still when other streams are
busy), it joins headers and body into one copy of the body per request, and it costs
a few hundred microseconds of Python per request. :mod:`sessiongen.client.http1` holds
the lean HTTP/1.1 exchange used instead. A :class:`Client` owns both: the pool of
keep-alive connections measured requests go through, and an aiohttp session for the
small requests nobody times (``/metrics``, health checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType

import aiohttp
import orjson

from sessiongen.client import http1
from sessiongen.client.result import Result
from sessiongen.client.sse import SSEParser, StreamFault, take_usage

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "Client", "Result", "send", "serialize"]


class _Sink(http1.Sink):
    """Routes the response of one request into its :class:`Result`."""

    def __init__(self, res: Result, stream: bool) -> None:
        self.res = res
        self.stream = stream
        self.sse = SSEParser(res)
        self.body: list[bytes] = []
        self.size = 0

    def start(self, send_ns: int) -> None:
        self.res.send_ns = send_ns

    def head(self, status: int, headers: dict[str, str], now: int) -> None:
        self.res.http_status = status
        self.res.headers = headers
        self.res.ttfb_s = (now - self.res.send_ns) / 1e9
        if status >= 400:
            self.stream = False

    def data(self, chunk: bytes, now: int) -> bool:
        if self.stream:
            try:
                self.sse.feed(chunk, now)
            except StreamFault as exc:
                raise http1.ProtocolFault(str(exc)) from None
            if self.sse.done:
                self.res.e2e_s = (now - self.res.send_ns) / 1e9
            return self.sse.done
        if self.size < http1.MAX_ERROR_BODY or self.res.http_status == 200:
            self.body.append(chunk)
            self.size += len(chunk)
        return False


async def send(
    pool: http1.Pool,
    url: str,
    body: bytes | Sequence[bytes],
    *,
    stream: bool = True,
    timeout_s: float = 900.0,
    headers: dict[str, str] | None = None,
) -> Result:
    """POST a pre-serialized body through ``pool`` and measure it; faults become statuses.

    ``body`` may come in parts, sent in order and never joined: a caller can keep a
    session's serialized context once and send it with every turn, rather than hold
    a fresh copy of it for every request in flight.
    """
    res = Result()
    sink = _Sink(res, stream)
    try:
        ex = await http1.exchange(pool, url, body, sink, timeout_s=timeout_s, headers=headers)
    except http1.ConnectFault as exc:
        res.status, res.error = "connect_error", str(exc)[:200]
        return res
    res.connect_s = ex.connect_s
    res.reads = ex.reads
    if ex.fault is not None:
        kind, message = ex.fault
        res.status, res.error = kind, message[:200]
    elif res.http_status is not None and res.http_status >= 400:
        text = b"".join(sink.body).decode(errors="replace")
        res.status, res.error = "http_error", _error_message(res.http_status, text)
    elif not stream:
        _take_whole(b"".join(sink.body), ex.end_ns, res)
    elif not sink.sse.done:
        res.status, res.error = "stream_error", "truncated stream: ended without data: [DONE]"
    if res.e2e_s is None:
        res.e2e_s = (ex.end_ns - res.send_ns) / 1e9
    if res.status == "ok" and res.ttft_s is None:
        res.status, res.error = "no_content", "stream ended without any content delta"
    return res


def _take_whole(raw: bytes, now: int, res: Result) -> None:
    """A non-streaming response: the whole text arrives at once."""
    res.e2e_s = (now - res.send_ns) / 1e9
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        res.status, res.error = "stream_error", "malformed JSON response"
        return
    choice = (obj.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
    if text:
        res.ttft_s = res.e2e_s
        res.chunk_ns.append(now)
        res.pieces.append(text)
    take_usage(obj.get("usage") or {}, res)
    res.usage_chunk = obj


def _error_message(status: int, text: str) -> str:
    try:
        obj = orjson.loads(text)
        message = obj.get("error", {}).get("message") or obj.get("message") or text
    except (orjson.JSONDecodeError, AttributeError):
        message = text
    return f"HTTP {status}: {str(message).strip()[:200]}"


class Client:
    """One run's connections: the pool measured requests use, and an aiohttp session.

    ``concurrency`` bounds the idle connections kept per host. ``pool`` replaces the
    default one (calibration passes a pool whose connections plant a known delay).
    Use as an async context manager, or call :meth:`close`.
    """

    def __init__(
        self, concurrency: int, connect_timeout_s: float, *, pool: http1.Pool | None = None
    ) -> None:
        self.pool = pool or http1.Pool(
            max_idle_per_host=max(1, concurrency) + 8, connect_timeout_s=connect_timeout_s
        )
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        self.http = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        )

    async def prewarm(self, url: str, connections: int) -> int:
        """Open ``connections`` keep-alive connections to ``url``'s host ahead of time.

        So that no measured request pays for connection setup. Returns how many are
        idle in the pool afterwards.
        """
        return await self.pool.prewarm(url, connections)

    async def send(
        self,
        url: str,
        body: bytes | Sequence[bytes],
        *,
        stream: bool = True,
        timeout_s: float = 900.0,
        headers: dict[str, str] | None = None,
    ) -> Result:
        """:func:`send` through this client's pool."""
        return await send(self.pool, url, body, stream=stream, timeout_s=timeout_s, headers=headers)

    async def close(self) -> None:
        """Close every connection (measured and not)."""
        self.pool.close()
        await self.http.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def serialize(body: Mapping[str, object]) -> bytes:
    """Request body bytes (orjson: several times faster than json for 1 MB bodies)."""
    return orjson.dumps(body)
