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
a few hundred microseconds of Python per request. :mod:`sessiongen.client.http1` holds the
lean HTTP/1.1 exchange used instead; the ``aiohttp.ClientSession`` that ``send`` takes
owns its connection pool (see :func:`new_client_session`) and still serves the small
non-timed requests (``/metrics``, health checks).
"""

from __future__ import annotations

import hashlib
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from sessiongen.client import http1

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass
class Result:
    """What one request measured. Durations are wall seconds; None when never reached."""

    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    send_ns: int = 0
    ttfb_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_ns: list[int] = field(default_factory=list)
    reasoning_chunks: int = 0
    pieces: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    first_logprob: float | None = None
    logprob_tokens: list[str] = field(default_factory=list)
    # Reference server stamps (calibration only), on the same monotonic clock as send_ns:
    server_ns: int | None = None  # its own time from body received to first chunk written
    server_rx_ns: int | None = None  # when the last request byte reached its socket
    server_tx_ns: int | None = None  # when it wrote the first content chunk
    connect_s: float | None = None  # connection setup before send_ns (None: reused)
    reads: int = 0  # socket reads that delivered response bytes

    @property
    def text(self) -> str:
        """The output text (joined once: appending to a str per chunk is quadratic)."""
        return "".join(self.pieces)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def itl(self) -> list[float]:
        """Gaps between consecutive content deltas, seconds."""
        ns = self.chunk_ns
        return [(b - a) / 1e9 for a, b in itertools.pairwise(ns)]

    def output_digest(self) -> str | None:
        """Digest of the output tokens (logprob tokens when given, else the text)."""
        if not self.ok:
            return None
        basis = "\x1f".join(self.logprob_tokens) if self.logprob_tokens else self.text
        return hashlib.blake2b(basis.encode(), digest_size=8).hexdigest()

    def row(self) -> dict[str, Any]:
        """The measured part of a requests.parquet row."""
        itl = self.itl()
        return {
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "ttfb_s": self.ttfb_s,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "itl_p50_s": statistics.median(itl) if itl else None,
            "itl_max_s": max(itl) if itl else None,
            "output_chunks": len(self.chunk_ns),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "first_logprob": self.first_logprob,
            "output_digest": self.output_digest(),
            "output_text": self.text[:200] if self.ok else None,
        }


class _StreamFault(Exception):
    pass


def _handle_event(data: bytes, now: int, res: Result) -> bool:
    """Apply one SSE ``data`` payload; True when it was ``[DONE]``."""
    if data == b"[DONE]":
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _StreamFault(f"malformed SSE data: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise _StreamFault(f"malformed SSE data: {data[:80]!r}")
    if "error" in obj:
        raise _StreamFault(f"server error in stream: {str(obj['error'])[:160]}")
    if "server_ns" in obj:
        res.server_ns = obj["server_ns"]
        res.server_rx_ns = obj.get("server_rx_ns")
        res.server_tx_ns = obj.get("server_tx_ns")
    usage = obj.get("usage")
    if usage:
        res.prompt_tokens = usage.get("prompt_tokens")
        res.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        res.cached_tokens = details.get("cached_tokens")
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        if delta is not None:
            content = delta.get("content")
            if delta.get("reasoning_content") or delta.get("reasoning"):
                res.reasoning_chunks += 1
        else:
            content = choice.get("text")
        if content:
            if res.ttft_s is None:
                res.ttft_s = (now - res.send_ns) / 1e9
            res.chunk_ns.append(now)
            res.pieces.append(content)
        logprobs = choice.get("logprobs")
        if logprobs:
            _take_logprobs(logprobs, res)
    return False


def _take_logprobs(logprobs: Any, res: Result) -> None:
    if isinstance(logprobs.get("content"), list):  # chat
        for item in logprobs["content"]:
            if res.first_logprob is None:
                res.first_logprob = item.get("logprob")
            res.logprob_tokens.append(str(item.get("token")))
    elif isinstance(logprobs.get("token_logprobs"), list):  # completions
        for tok, lp in zip(logprobs.get("tokens") or [], logprobs["token_logprobs"], strict=False):
            if res.first_logprob is None:
                res.first_logprob = lp
            res.logprob_tokens.append(str(tok))


class _SSE:
    """Incremental SSE parser on bytes: events are split at blank lines, in place.

    The common event is one ``data: {...}`` line; it is recognised with two C-level
    searches and handed to orjson without building a list of lines. Buffered bytes
    are only the tail of an incomplete event, so the work per read is linear in
    what arrived (no re-scanning, no quadratic re-slicing of a growing buffer).
    """

    __slots__ = ("_cr", "_tail", "done", "res")

    def __init__(self, res: Result) -> None:
        self.res = res
        self.done = False
        self._tail = b""
        self._cr = False  # a chunk ended in "\r": it may pair with a leading "\n"

    def feed(self, data: bytes, now: int) -> None:
        """Parse what arrived; raises :class:`_StreamFault` on a malformed event."""
        if self.done:
            return
        if b"\r" in data or self._cr:  # CRLF or CR line ends: normalise (rare path)
            if self._cr and data.startswith(b"\n"):
                data = data[1:]
            self._cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._tail + data if self._tail else data
        pos = 0
        while True:
            end = buf.find(b"\n\n", pos)
            if end < 0:
                break
            if buf.startswith(b"data: ", pos) and buf.find(b"\n", pos, end) < 0:
                payload: bytes | None = buf[pos + 6 : end]
            else:
                payload = _event_data(buf[pos:end])
            pos = end + 2
            if payload is not None and _handle_event(payload, now, self.res):
                self.done = True
                self._tail = b""
                return
        self._tail = buf[pos:] if pos else buf


def _event_data(event: bytes) -> bytes | None:
    """The data of a general SSE event (several data lines, comments, other fields)."""
    lines = [
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(lines) if lines else None


class _Sink(http1.Sink):
    """Routes the response body of one request into its :class:`Result`."""

    def __init__(self, res: Result, stream: bool) -> None:
        self.res = res
        self.stream = stream
        self.sse = _SSE(res)
        self.body: list[bytes] = []
        self.size = 0

    def start(self, send_ns: int) -> None:
        self.res.send_ns = send_ns

    def head(self, status: int, now: int) -> None:
        self.res.http_status = status
        self.res.ttfb_s = (now - self.res.send_ns) / 1e9
        if status >= 400:
            self.stream = False

    def data(self, chunk: bytes, now: int) -> bool:
        if self.stream:
            try:
                self.sse.feed(chunk, now)
            except _StreamFault as exc:
                raise http1.ProtocolFault(str(exc)) from None
            if self.sse.done:
                self.res.e2e_s = (now - self.res.send_ns) / 1e9
            return self.sse.done
        if self.size < http1.MAX_ERROR_BODY or self.res.http_status == 200:
            self.body.append(chunk)
            self.size += len(chunk)
        return False


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | Sequence[bytes],
    *,
    stream: bool = True,
    timeout_s: float = 900.0,
    extra_headers: dict[str, str] | None = None,
    pre_send_delay_s: float = 0.0,
) -> Result:
    """POST a pre-serialized body and measure it; faults are recorded in the result.

    ``body`` may come in parts, sent in order and never joined: a caller can keep a
    session's serialized context once and send it with every turn, rather than hold
    a fresh copy of it for every request in flight.

    Connections come from the pool owned by ``session`` when it was made by
    :func:`new_client_session`; any other session gets a fresh connection per request.
    ``pre_send_delay_s`` waits inside the timed span before sending: a planted client
    delay for tests of the calibration, never used in measurements.
    """
    res = Result()
    sink = _Sink(res, stream)
    try:
        outcome = await http1.exchange(
            _pool_of(session),
            url,
            body,
            sink,
            timeout_s=timeout_s,
            connect_timeout_s=_connect_timeout(session, timeout_s),
            headers=extra_headers,
            pre_send_delay_s=pre_send_delay_s,
        )
    except http1.ConnectFault as exc:
        res.status, res.error = "connect_error", str(exc)[:200]
        return res
    res.connect_s = outcome.connect_s
    res.reads = outcome.reads
    if outcome.fault is not None:
        kind, message = outcome.fault
        res.status, res.error = kind, message[:200]
    elif res.http_status is not None and res.http_status >= 400:
        text = b"".join(sink.body).decode(errors="replace")
        res.status, res.error = "http_error", _error_message(res.http_status, text)
    elif not stream:
        _take_whole(b"".join(sink.body), outcome.end_ns, res)
    elif not sink.sse.done:
        res.status, res.error = "stream_error", "truncated stream: ended without data: [DONE]"
    if res.e2e_s is None:
        res.e2e_s = (outcome.end_ns - res.send_ns) / 1e9
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
    usage = obj.get("usage") or {}
    res.prompt_tokens = usage.get("prompt_tokens")
    res.completion_tokens = usage.get("completion_tokens")
    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def _error_message(status: int, text: str) -> str:
    try:
        obj = orjson.loads(text)
        message = obj.get("error", {}).get("message") or obj.get("message") or text
    except (orjson.JSONDecodeError, AttributeError):
        message = text
    return f"HTTP {status}: {str(message).strip()[:200]}"


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector plus the driver's pool of raw keep-alive connections.

    Closing the session closes the connector, and with it the pool's connections.
    """

    def __init__(self, pool: http1.Pool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.driver_pool = pool

    def close(self, *args: Any, **kwargs: Any) -> Any:
        self.driver_pool.close()
        return super().close(*args, **kwargs)


def new_client_session(concurrency: int, connect_timeout_s: float) -> aiohttp.ClientSession:
    """One client session for a run: reused connections, no connection limit below need.

    ``concurrency`` bounds the idle connections kept per host.
    """
    pool = http1.Pool(max_idle_per_host=max(1, concurrency) + 8)
    connector = _Connector(pool, limit=0, limit_per_host=0, keepalive_timeout=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


def _pool_of(session: aiohttp.ClientSession) -> http1.Pool | None:
    connector = session.connector
    return connector.driver_pool if isinstance(connector, _Connector) else None


def _connect_timeout(session: aiohttp.ClientSession, default: float) -> float:
    timeout = session.timeout
    return timeout.sock_connect or timeout.connect or default


async def prewarm(session: aiohttp.ClientSession, url: str, connections: int) -> int:
    """Open ``connections`` keep-alive connections to ``url``'s host ahead of time.

    So that no measured request pays for connection setup. Returns how many are idle
    in the pool afterwards (0 for a session not made by :func:`new_client_session`).
    """
    pool = _pool_of(session)
    if pool is None:
        return 0
    return await pool.prewarm(url, connections, _connect_timeout(session, 10.0))


def serialize(body: dict[str, Any]) -> bytes:
    """Request body bytes (orjson: several times faster than json for 1 MB bodies)."""
    return orjson.dumps(body)
