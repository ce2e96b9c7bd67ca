"""The driver: timing definitions and every fault recorded as a status, never raised."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import time
from typing import Any

import orjson
import pytest

from sessiongen.client import driver, http1
from tests.support.fakeserver import make_app

BODY = driver.serialize({"model": "sim-27b", "messages": [{"role": "user", "content": "hi"}]})


async def _send(aiohttp_server: Any, mode: str, timeout_s: float = 5.0, **kw: Any) -> driver.Result:
    server = await aiohttp_server(make_app(mode, **kw))
    async with driver.Client(4, 5.0) as client:
        return await client.send(
            str(server.make_url("/v1/chat/completions")), BODY, timeout_s=timeout_s
        )


async def test_ok_stream_is_timed_and_usage_read(aiohttp_server: Any) -> None:
    res = await _send(aiohttp_server, "ok", delay_s=0.05, chunks=5)
    assert res.status == "ok", res.error
    assert res.ttfb_s is not None and res.ttft_s is not None and res.e2e_s is not None
    assert res.ttfb_s <= res.ttft_s <= res.e2e_s
    assert res.ttft_s >= 0.05
    assert res.text == " tok0 tok1 tok2 tok3 tok4"
    assert len(res.chunk_ns) == 5 and len(res.itl()) == 4
    assert res.prompt_tokens == 10 and res.completion_tokens == 5 and res.cached_tokens == 0
    assert res.output_digest() is not None


async def test_reasoning_deltas_do_not_end_ttft(aiohttp_server: Any) -> None:
    res = await _send(aiohttp_server, "reasoning")
    assert res.status == "ok"
    assert res.reasoning_chunks == 2
    assert res.ttft_s is not None and res.ttft_s >= 0.02


@pytest.mark.parametrize(
    ("mode", "status", "fragment"),
    [
        ("http500", "http_error", "HTTP 500: boom"),
        ("http400", "http_error", "HTTP 400: bad model"),
        ("reset", "stream_error", ""),
        ("malformed", "stream_error", "malformed SSE"),
        ("truncated", "stream_error", "truncated"),
        ("empty", "no_content", "without any content"),
    ],
)
async def test_faults_become_statuses(
    aiohttp_server: Any, mode: str, status: str, fragment: str
) -> None:
    res = await _send(aiohttp_server, mode)
    assert res.status == status, (res.status, res.error)
    assert fragment in (res.error or "")
    assert not res.ok and res.output_digest() is None


async def test_stall_past_timeout_is_a_timeout(aiohttp_server: Any) -> None:
    res = await _send(aiohttp_server, "stall", timeout_s=0.3)
    assert res.status == "timeout"


async def test_connection_refused_is_recorded() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with driver.Client(1, 2.0) as client:
        res = await client.send(f"http://127.0.0.1:{port}/v1/chat/completions", BODY)
    assert res.status == "connect_error"


async def test_completions_text_is_content(aiohttp_server: Any) -> None:
    server = await aiohttp_server(make_app("ok"))
    body = driver.serialize({"model": "sim-27b", "prompt": "hi"})
    pool = http1.Pool(max_idle_per_host=0)  # no keep-alive: a connection per request
    res = await driver.send(pool, str(server.make_url("/v1/completions")), body)
    assert res.status == "ok" and res.text.startswith(" tok0")


# The HTTP/1.1 exchange underneath: framing, splits, connection reuse.


def _sse_events(crlf: bool) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    events = [
        b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"h\\u00e9llo"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":" w\\u00f6rld"}}]}',
        b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
        b"[DONE]",
    ]
    out = b": a comment" + nl + nl
    for event in events:
        out += b"data: " + event + nl + nl
    return out


def _framed(body: bytes, framing: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "chunked":
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 37]), body[i : i + 37])
            for i in range(0, len(body), 37)
        )
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-Trailer: 1\r\n\r\n"
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    return head.replace(b"1.1", b"1.0") + b"\r\n" + body  # until the connection closes


class _Wire(asyncio.Transport):
    """A transport that only records whether the connection was dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def write(self, data: Any) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


async def _exchange(
    raw: bytes, cuts: list[int], until_eof: bool = False
) -> tuple[Any, driver.Result, _Wire]:
    """Feed a raw response to a connection in the pieces ``cuts`` makes; how it ended."""
    conn = http1.Conn(http1.Pool(), ("http", "test", 80))
    wire = _Wire()
    conn.connection_made(wire)
    res = driver.Result()
    sink = driver._Sink(res, stream=True)
    sink.start(time.perf_counter_ns())
    done = conn.begin(sink, 5.0, res.send_ns)
    edges = [0, *sorted(cuts), len(raw)]
    for a, b in itertools.pairwise(edges):
        if b > a:
            conn.data_received(raw[a:b])
    if until_eof:
        conn.eof_received()
    end = await asyncio.wait_for(done, 2.0)
    return end, res, wire


async def _parse(raw: bytes, cuts: list[int], until_eof: bool) -> driver.Result:
    end, res, _wire = await _exchange(raw, cuts, until_eof)
    assert end.fault is None, end.fault
    return res


@pytest.mark.parametrize("framing", ["chunked", "length", "eof"])
@pytest.mark.parametrize("crlf", [False, True])
async def test_responses_parse_the_same_however_they_are_split(framing: str, crlf: bool) -> None:
    raw = _framed(_sse_events(crlf), framing)
    rng = random.Random(len(raw))
    splits = [[], list(range(1, len(raw))), *(rng.sample(range(1, len(raw)), 9) for _ in range(20))]
    for cuts in splits:
        res = await _parse(raw, cuts, until_eof=framing == "eof")
        assert res.http_status == 200
        assert res.text == "héllo wörld", cuts
        assert len(res.chunk_ns) == 2 and res.completion_tokens == 2


async def test_an_interim_response_is_skipped_however_it_is_split() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    raw += _framed(_sse_events(crlf=False), "length")
    for cuts in ([], list(range(1, len(raw)))):
        end, res, wire = await _exchange(raw, cuts)
        assert end.fault is None and res.http_status == 200, end.fault
        assert res.text == "héllo wörld" and "link" not in (res.headers or {})
        assert not wire.closed  # kept for the next request


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata\r\n", "chunk"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata!!\r\n", "chunk"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n", "Content-Length"),
        (b"SPDY/3 200 OK\r\n\r\n", "malformed HTTP response"),
        (b"HTTP/1.1 OK\r\n\r\n", "malformed HTTP response"),
    ],
)
async def test_broken_framing_is_a_stream_error(raw: bytes, fragment: str) -> None:
    end, _res, wire = await _exchange(raw, [])
    assert end.fault is not None and end.fault[0] == "stream_error", end.fault
    assert fragment.lower() in end.fault[1].lower(), end.fault
    assert wire.closed


async def test_a_response_head_past_the_limit_is_a_stream_error() -> None:
    raw = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * http1.MAX_HEAD
    end, _res, wire = await _exchange(raw, list(range(4096, len(raw), 4096)))
    assert end.fault is not None and end.fault[0] == "stream_error"
    assert "head too long" in end.fault[1] and wire.closed


@pytest.mark.parametrize("framing", ["chunked", "length"])
async def test_bytes_after_the_end_drop_the_connection(framing: str) -> None:
    raw = _framed(_sse_events(crlf=False), framing)
    for tail, cuts in ((b"", []), (b"junk", []), (b"junk", [len(raw)]), (b"HTTP/1.1 200", [])):
        end, res, wire = await _exchange(raw + tail, cuts)
        assert end.fault is None and res.text == "héllo wörld", end.fault
        assert wire.closed == bool(tail), tail  # out of step: never reused


async def test_connections_are_prewarmed_and_reused(aiohttp_server: Any) -> None:
    server = await aiohttp_server(make_app("ok"))
    url = str(server.make_url("/v1/chat/completions"))
    async with driver.Client(2, 5.0) as client:
        assert await client.prewarm(url, 2) == 2
        first = await client.send(url, BODY)
        second = await client.send(url, BODY)
    assert first.ok and second.ok
    assert first.connect_s is None and second.connect_s is None  # no setup in either


async def test_a_pooled_connection_the_server_dropped_is_retried_once() -> None:
    """The server answers one request per connection, then drops it unanswered."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"ok"}}]}\n\ndata: [DONE]\n\n'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(event), event)
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for turn in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if turn == 1:
                break
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with driver.Client(1, 5.0) as client:
        first = await client.send(url, BODY)
        second = await client.send(url, BODY)
    server.close()
    assert first.ok and second.ok, (first.error, second.error)
    assert second.connect_s is not None and connections == 2


async def test_a_large_body_arrives_intact_whole_or_in_parts(aiohttp_server: Any) -> None:
    from aiohttp import web

    async def digest(request: web.Request) -> web.StreamResponse:
        got = await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        text = f"{len(got)}:{hashlib.blake2b(got, digest_size=8).hexdigest()}"
        chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application(client_max_size=8 * 2**20)
    app.router.add_post("/v1/chat/completions", digest)
    server = await aiohttp_server(app)
    body = driver.serialize({"messages": [{"role": "user", "content": "x" * 1_500_000}]})
    url = str(server.make_url("/v1/chat/completions"))
    async with driver.Client(1, 5.0) as client:
        whole = await client.send(url, body)
        parts = await client.send(url, [body[:7], body[7:1_200_000], b"", body[1_200_000:]])
    expected = f"{len(body)}:{hashlib.blake2b(body, digest_size=8).hexdigest()}"
    assert whole.ok and parts.ok, (whole.error, parts.error)
    assert whole.text == expected and parts.text == expected


def test_header_values_cannot_smuggle_lines() -> None:
    tgt = http1.route("http://127.0.0.1:8000/v1/chat/completions")
    with pytest.raises(ValueError):
        tgt.request_head(10, {"X-Evil": "a\r\nHost: elsewhere"})
    head = tgt.request_head(10, {"Authorization": "Bearer t"})
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert b"Authorization: Bearer t\r\n" in head and head.endswith(b"Content-Length: 10\r\n\r\n")


async def test_a_non_streaming_answer_arrives_whole(aiohttp_server: Any) -> None:
    from aiohttp import web

    async def whole(_request: web.Request) -> web.Response:
        usage = {"prompt_tokens": 4, "completion_tokens": 2}
        return web.json_response(
            {"choices": [{"message": {"content": "two words"}}], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", whole)
    server = await aiohttp_server(app)
    async with driver.Client(1, 5.0) as client:
        res = await client.send(str(server.make_url("/v1/chat/completions")), BODY, stream=False)
    assert res.ok and res.text == "two words"
    assert res.ttft_s == res.e2e_s and res.completion_tokens == 2
