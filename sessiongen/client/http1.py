"""A lean HTTP/1.1 client exchange for the driver: POST a body, stream the response.

What it does that a general client does not, and why (every item is a measurement):

- the clock is read first thing in ``data_received``, right after the ``recv`` that
  delivered the bytes, so other streams' work cannot sit between a read and its
  timestamp;
- the response (status line, headers, chunked or length-framed body) is parsed in
  that same callback by ``httptools`` (llhttp, the C parser uvicorn and Node use:
  framing, interim 1xx responses, keep-alive rules, malformed input) and handed to a
  :class:`Sink` without waking a coroutine per read. It replaced a hand parser at no
  cost in added TTFT and for less CPU per read (0.35 us per chunk read, not 1.24;
  ``bench/driver_overhead.py`` flat-out capacity 256k -> 362k chunks per CPU-second);
- the request body is written from a ``memoryview`` in slices under the transport's
  flow control: no copy of the body joined with the headers, and at most one slice
  per connection waits in user-space buffers however large the body;
- keep-alive connections are pooled per (scheme, host, port) and can be opened ahead
  of time (:meth:`Pool.prewarm`); a pooled connection the server had already closed
  is retried once on a fresh one (nothing of the response had arrived).

Only what OpenAI-compatible servers send is supported: no proxies, no compression
(none is asked for), no pipelining, no ``Expect: 100-continue``.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

import httptools

from sessiongen._version import __version__

MAX_HEAD = 64 * 1024  # response status line + headers
MAX_ERROR_BODY = 64 * 1024  # kept of an error response body
WRITE_SLICE = 1 << 20  # body bytes handed to the transport at a time (see Conn.write)
_SMALL_BODY = 16 * 1024  # below this, headers and body go out in one write

Buffer = bytes | bytearray | memoryview


class ConnectFault(Exception):
    """No connection could be made (refused, unresolvable, connect timeout, TLS)."""


class ProtocolFault(Exception):
    """The response broke HTTP/1.1 framing or its content (raised by a sink)."""


class _AfterEnd(Exception):
    """Raised in the parser's callback to stop it at bytes after the response's end."""


class Sink:
    """Receives one response as it is parsed; every call carries the read's timestamp."""

    def start(self, send_ns: int) -> None:
        """The request is about to be written (called again if it is retried)."""

    def head(self, status: int, headers: dict[str, str], now: int) -> None:
        """The status line and headers (names lowercased) arrived."""

    def data(self, chunk: bytes, now: int) -> bool:
        """Body bytes arrived; return True once the caller has what it waits for."""
        return False


@dataclass(frozen=True)
class Exchange:
    """How one exchange ended: times on ``perf_counter_ns`` and a fault, if any."""

    send_ns: int
    end_ns: int
    connect_s: float | None  # None: a pooled connection was reused
    fault: tuple[str, str] | None  # (status, message): stream_error | timeout
    reads: int = 0  # socket reads that delivered response bytes, until the end


@dataclass(frozen=True)
class _End:
    end_ns: int
    fault: tuple[str, str] | None
    retryable: bool  # nothing of the response arrived: safe to send again
    reads: int


@dataclass(frozen=True)
class Route:
    """Where a URL points, with the fixed part of the request head pre-encoded."""

    scheme: str
    host: str
    port: int
    prefix: bytes

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    def request_head(self, length: int, headers: dict[str, str] | None) -> bytes:
        """The request line and headers for a body of ``length`` bytes."""
        fields = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if headers:
            fields.update(headers)
        text = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        if text.count("\r") != len(fields) or text.count("\n") != len(fields):
            raise ValueError("header names and values must not contain line breaks")
        return b"%s%sContent-Length: %d\r\n\r\n" % (self.prefix, text.encode("latin-1"), length)


@functools.lru_cache(maxsize=1024)
def route(url: str) -> Route:
    """Parse ``url`` once (URLs repeat: a few replicas times one API path)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s) URL, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    netloc = parts.netloc.rpartition("@")[2]
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    prefix = f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\nUser-Agent: sessiongen/{__version__}\r\n"
    return Route(parts.scheme, parts.hostname, port, prefix.encode("latin-1"))


class Conn(asyncio.Protocol):
    """One keep-alive connection; parses the response of the request in flight."""

    def __init__(self, pool: Pool, key: tuple[str, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.alive = False
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._done: asyncio.Future[_End] | None = None
        self._reads = 0
        self._parser: httptools.HttpResponseParser | None = None
        self._now = 0  # the timestamp of the read being parsed
        self._head_bytes = 0  # received before the final response head was complete
        self._in_head = True
        self._fields: dict[str, str] = {}
        self._until_eof = False  # no length, not chunked: the body ends with the connection
        self._ended = False  # the parser saw the end of the response
        self._keep_alive = True
        self._got_bytes = False
        self._last_rx = 0
        self._timeout_ns = 0
        self._timer: asyncio.TimerHandle | None = None

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.alive = True

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if self._sink is None:  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        self._last_rx = now
        self._got_bytes = True
        self._reads += 1
        self._now = now
        try:
            self._feed(data)
        except ProtocolFault as exc:
            self._fail("stream_error", str(exc), now)

    def eof_received(self) -> bool:
        self.alive = False
        if self._sink is not None and self._until_eof:
            self._complete(time.perf_counter_ns())
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.pool.forget(self)
        self._wake_writer()
        if self._sink is not None:
            now = time.perf_counter_ns()
            if self._until_eof and exc is None:
                self._complete(now)
            else:
                why = str(exc) if exc else "the server closed the connection"
                self._fail("stream_error", f"connection lost mid-stream: {why}", now)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writer()

    # one exchange

    def begin(self, sink: Sink, timeout_s: float, send_ns: int) -> asyncio.Future[_End]:
        """Expect a response for ``sink``; the future tells how it ended."""
        loop = asyncio.get_running_loop()
        self._sink = sink
        self._done = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._head_bytes = 0
        self._in_head = True
        self._fields = {}
        self._until_eof = False
        self._ended = False
        self._keep_alive = True
        self._got_bytes = False
        self._reads = 0
        self._last_rx = send_ns
        self._timeout_ns = int(timeout_s * 1e9)
        self._timer = loop.call_later(timeout_s, self._check_timeout)
        return self._done

    async def write(self, head: bytes, body: Sequence[Buffer]) -> None:
        """Write the request: the body's parts in slices as the socket drains, never joined.

        Slices are large and written back to back while the kernel takes them: on
        loopback yielding to the loop between smaller slices cost every request an
        extra loop turn (p50 added TTFT 0.2 -> 0.4 ms at 64 streams) and bought no
        better tail. Flow control still bounds what waits in user space to one slice.
        """
        transport = self.transport
        assert transport is not None
        if len(body) == 1 and len(body[0]) <= _SMALL_BODY:
            transport.write(head + bytes(body[0]))
            return
        transport.write(head)
        for part in body:
            view = memoryview(part).cast("B")
            for offset in range(0, len(view), WRITE_SLICE):
                if self._paused:
                    self._drained = asyncio.get_running_loop().create_future()
                    await self._drained
                if self._sink is None or not self.alive:
                    return  # the response already ended (an early error) or the link broke
                transport.write(view[offset : offset + WRITE_SLICE])

    def close(self, *, graceful: bool = False) -> None:
        """Drop the connection: at once on a fault, gracefully when merely not kept."""
        self.alive = False
        if self.transport is not None:
            if graceful:
                self.transport.close()
            else:
                self.transport.abort()

    # internals

    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _check_timeout(self) -> None:
        if self._sink is None:
            return
        now = time.perf_counter_ns()
        idle = now - self._last_rx
        if idle >= self._timeout_ns:
            self._fail("timeout", f"no bytes for {self._timeout_ns / 1e9:g} s", now)
        else:
            delay = (self._timeout_ns - idle) / 1e9
            self._timer = asyncio.get_running_loop().call_later(delay, self._check_timeout)

    def _finish(self, now: int, fault: tuple[str, str] | None, retryable: bool = False) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(_End(now, fault, retryable, self._reads))

    def _fail(self, kind: str, message: str, now: int) -> None:
        retryable = kind == "stream_error" and not self._got_bytes
        self._finish(now, (kind, message), retryable)
        self._end()
        self.close()

    def _complete(self, now: int) -> None:
        self._finish(now, None)
        self._end()
        if self._keep_alive and self.alive:
            self.pool.release(self)
        else:
            self.close(graceful=True)

    def _end(self) -> None:
        self._sink = None
        self._parser = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _feed(self, data: bytes) -> None:
        """Parse one read; the callbacks below hand the response to the sink."""
        parser = self._parser
        assert parser is not None
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, _AfterEnd):
                raise cause or ProtocolFault(f"malformed HTTP response: {exc}") from None
            self._keep_alive = False  # bytes after the end: the connection is out of step
        except httptools.HttpParserUpgrade:
            raise ProtocolFault("malformed HTTP response: protocol upgrade") from None
        except httptools.HttpParserError as exc:
            if not self._ended:
                raise ProtocolFault(f"malformed HTTP response: {exc}") from None
            self._keep_alive = False  # data after a Connection: close response
        if self._ended:
            self._complete(self._now)
        elif self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                raise ProtocolFault("malformed HTTP response: response head too long")

    # httptools callbacks, called from inside feed_data

    def on_message_begin(self) -> None:
        """A response starts; a second one in the same exchange is bytes after the end."""
        if self._ended:
            raise _AfterEnd

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header line (also a trailer after a chunked body: those are dropped)."""
        if self._in_head:
            self._fields[name.lower().decode("latin-1")] = value.strip().decode("latin-1")

    def on_headers_complete(self) -> None:
        """The head is complete: interim 1xx heads are skipped, the final one goes on."""
        assert self._parser is not None and self._sink is not None
        status = self._parser.get_status_code()
        fields, self._fields = self._fields, {}
        if 100 <= status < 200:
            return  # interim response: the real head follows
        self._in_head = False
        self._until_eof = "content-length" not in fields and (
            "chunked" not in fields.get("transfer-encoding", "").lower()
        )
        self._keep_alive = not self._until_eof
        self._sink.head(status, fields, self._now)

    def on_body(self, body: bytes) -> None:
        """Body bytes, de-chunked."""
        sink = self._sink
        if sink is not None and sink.data(body, self._now):
            self._finish(self._now, None)

    def on_message_complete(self) -> None:
        """A response ended: an interim one, or the one this exchange waits for."""
        if self._in_head:
            return
        assert self._parser is not None
        self._ended = True
        self._until_eof = False
        self._keep_alive = self._parser.should_keep_alive()


class Pool:
    """Idle keep-alive connections per (scheme, host, port), most recently used first.

    ``connect_timeout_s`` bounds each new connection. ``conn_class`` makes connections:
    a subclass of :class:`Conn` can change how a request is written (calibration plants
    a known client delay that way) without a branch on the measured path.
    """

    def __init__(
        self,
        max_idle_per_host: int = 64,
        *,
        connect_timeout_s: float = 10.0,
        conn_class: type[Conn] | None = None,
    ) -> None:
        self.max_idle = max_idle_per_host
        self.connect_timeout_s = connect_timeout_s
        self.conn_class = conn_class or Conn
        self._idle: dict[tuple[str, str, int], list[Conn]] = {}
        self._open: set[Conn] = set()
        self._ssl: ssl.SSLContext | None = None

    async def acquire(self, tgt: Route) -> tuple[Conn, float | None]:
        """A live idle connection (connect time None) or a new one (its connect time)."""
        idle = self._idle.get(tgt.key)
        while idle:
            conn = idle.pop()
            if conn.alive:
                return conn, None
        start = time.perf_counter_ns()
        conn = await self._connect(tgt)
        return conn, (time.perf_counter_ns() - start) / 1e9

    async def _connect(self, tgt: Route) -> Conn:
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if tgt.scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: self.conn_class(self, tgt.key), tgt.host, tgt.port, ssl=context
                )
        except TimeoutError:
            raise ConnectFault(f"cannot connect to {tgt.host}:{tgt.port}: timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFault(f"cannot connect to {tgt.host}:{tgt.port}: {exc}") from None
        self._open.add(conn)
        return conn

    def release(self, conn: Conn) -> None:
        """Take back a connection whose response was read to the end."""
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close(graceful=True)

    def forget(self, conn: Conn) -> None:
        """A connection closed (called from its ``connection_lost``)."""
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def prewarm(self, url: str, connections: int) -> int:
        """Open connections to ``url``'s host until ``connections`` are idle; how many are."""
        tgt = route(url)
        missing = connections - len(self._idle.get(tgt.key, ()))
        opened = await asyncio.gather(
            *(self._connect(tgt) for _ in range(max(0, missing))),
            return_exceptions=True,
        )
        for conn in opened:
            if isinstance(conn, Conn):
                self.release(conn)
        return len(self._idle.get(tgt.key, ()))

    def close(self) -> None:
        """Close every connection, idle or busy."""
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()


async def exchange(
    pool: Pool,
    url: str,
    body: Buffer | Sequence[Buffer],
    sink: Sink,
    *,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> Exchange:
    """POST ``body`` to ``url`` and feed the response to ``sink`` as it is read.

    ``body`` may be given in parts (sent in order, never joined), so that a caller
    can keep a large shared piece, such as a session's serialized context, once and
    send it with every request instead of building a new copy per request.

    Returns when the sink says it has what it waits for (the rest of the response is
    still read in the background so the connection can be reused), when the response
    ends, or on a fault. Raises :class:`ConnectFault` when no connection can be made.
    A pool with ``max_idle_per_host=0`` closes every connection after its exchange.
    """
    tgt = route(url)
    parts: Sequence[Buffer] = [body] if isinstance(body, bytes | bytearray | memoryview) else body
    head = tgt.request_head(sum(memoryview(p).nbytes for p in parts), headers)
    for attempt in (0, 1):
        conn, connect_s = await pool.acquire(tgt)
        send_ns = time.perf_counter_ns()
        sink.start(send_ns)
        done = conn.begin(sink, timeout_s, send_ns)
        try:
            await conn.write(head, parts)
            end = await done
        except BaseException:
            conn.close()
            raise
        if end.fault is not None and end.retryable and connect_s is None and attempt == 0:
            continue  # a pooled connection the server had closed: nothing was answered
        return Exchange(send_ns, end.end_ns, connect_s, end.fault, end.reads)
    raise AssertionError("unreachable")
