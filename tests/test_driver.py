"""The driver: timing definitions and every fault recorded as a status, never raised."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from sessiongen import driver
from tests.fakeserver import make_app

BODY = driver.serialize({"model": "sim-27b", "messages": [{"role": "user", "content": "hi"}]})


async def _send(aiohttp_server: Any, mode: str, timeout_s: float = 5.0, **kw: Any) -> driver.Result:
    server = await aiohttp_server(make_app(mode, **kw))
    async with driver.new_client_session(4, 5.0) as http:
        return await driver.send(
            http, str(server.make_url("/v1/chat/completions")), BODY, timeout_s=timeout_s
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
    async with driver.new_client_session(1, 2.0) as http:
        res = await driver.send(http, f"http://127.0.0.1:{port}/v1/chat/completions", BODY)
    assert res.status == "connect_error"


async def test_completions_text_is_content(aiohttp_server: Any) -> None:
    server = await aiohttp_server(make_app("ok"))
    body = driver.serialize({"model": "sim-27b", "prompt": "hi"})
    async with aiohttp.ClientSession() as http:
        res = await driver.send(http, str(server.make_url("/v1/completions")), body)
    assert res.status == "ok" and res.text.startswith(" tok0")
