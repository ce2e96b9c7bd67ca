"""The reference server: vLLM-shaped streaming answers after an exactly known delay.

It runs in its own process (:class:`ReferenceServer`), so it never shares the driver's
event loop, answers every streaming request after the delay the request names
(``X-Ref-Delay-S``), then streams content chunks one per socket write (``X-Ref-Chunks``,
paced by ``X-Ref-Chunk-Interval-S``). It notes three times on the machine's monotonic
clock (the one ``perf_counter_ns`` reads in every process on Linux) and sends them in
the final usage chunk, where the client keeps them without looking at any other chunk:

- ``server_rx_ns``: when the last byte of the request body reached its socket, from
  the kernel's receive timestamp (``SO_TIMESTAMPNS``), so neither its own loop being
  busy with other connections nor its wake-up latency is charged to the client;
- ``server_tx_ns``: just before it wrote the first content chunk;
- ``server_ns`` = tx - rx: its own time to first chunk (the delay, plus any lateness).
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import subprocess
import sys
import time

from sessiongen.infra import procs, signals

DELAY_HEADER = "X-Ref-Delay-S"
CHUNKS_HEADER = "X-Ref-Chunks"
INTERVAL_HEADER = "X-Ref-Chunk-Interval-S"
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_CHUNK_TEMPLATE = (
    b'{"id":"chatcmpl-ref","object":"chat.completion.chunk","created":0,"model":"ref",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}'
)


def _event(payload: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _event(b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}')
)
_PIECE = _event(_CHUNK_TEMPLATE)


def _tail(chunks: int, rx: int, tx: int) -> bytes:
    usage = (
        b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d},'
        b'"server_ns":%d,"server_rx_ns":%d,"server_tx_ns":%d}' % (chunks, tx - rx, rx, tx)
    )
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
        self.rx = self.tx = 0  # stamps of the response being written
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
        self.rx, self.tx = rx, time.perf_counter_ns()
        self._write(_PIECE)
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
            self._write(_tail(self.total, self.rx, self.tx))

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
            sec, nsec = (int(v) for v in struct.unpack("qq", data[:16]))
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
    """The reference server in a child process (its own process group); a context manager
    with its ``url``. It exits when its stdin closes; a group that does not is stopped."""

    def __init__(self) -> None:
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ReferenceServer:
        code = "from sessiongen.calibrate.refserver import serve_main; serve_main()"
        with signals.deferred():  # started and held in one step
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
        try:
            assert self._proc.stdout is not None
            ready, _, _ = select.select([self._proc.stdout], [], [], 60)
            line = self._proc.stdout.readline().decode() if ready else ""
            if not line.startswith("PORT "):
                raise RuntimeError(f"reference server did not start: {line!r}")
        except BaseException:  # __exit__ is not called when __enter__ fails
            self.__exit__()
            raise
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the server stops when its stdin closes
        procs.stop_child("reference server", proc, grace_s=10.0)
        if proc.stdout is not None:
            proc.stdout.close()
