"""Requests to in-process simulated replicas, as tests make them."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer


async def stream_facts(server: TestServer, ids: list[int], max_tokens: int = 2) -> dict[str, Any]:
    """The server's own account (``sim``) of one streamed completions request."""
    body = {
        "model": "sim-27b",
        "prompt": ids,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    facts: dict[str, Any] = {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url("/v1/completions"), data=orjson.dumps(body)) as resp,
    ):
        async for line in resp.content:
            if b'"usage"' in line:
                facts = orjson.loads(line[6:])["sim"]
    return facts
