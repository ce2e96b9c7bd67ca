"""A minimal router for tests: forwards each request to the next replica in turn.

Stands in for "your own gateway" where the tests must not depend on vllm-router: it
records every request it forwards (the session header, the body's ``user``), and by
default strips the simulator's ``x-sim-replica`` header, as a gateway in front of
replicas that do not name themselves would give nothing to go on.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

SEEN = web.AppKey("seen", list)
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Forwarded:
    """One request the gateway forwarded."""

    replica: int
    headers: dict[str, str]
    body: dict[str, Any] = field(repr=False)


def make_gateway(
    replica_urls: list[str], *, strip: tuple[str, ...] = ("x-sim-replica",)
) -> web.Application:
    """A round-robin gateway in front of ``replica_urls`` (app[SEEN]: what it forwarded)."""
    turn = itertools.count()
    seen: list[Forwarded] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        replica = next(turn) % len(replica_urls)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        seen.append(
            Forwarded(replica, {k.lower(): v for k, v in headers.items()}, orjson.loads(raw))
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(replica_urls[replica] + request.path, data=raw, headers=headers) as up,
        ):
            out_headers = {
                k: v
                for k, v in up.headers.items()
                if k.lower() not in _HOP and k.lower() not in strip
            }
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def models(_request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as http, http.get(replica_urls[0] + "/v1/models") as up:
            return web.Response(body=await up.read(), content_type="application/json")

    app = web.Application()
    app[SEEN] = seen
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_post("/v1/completions", forward)
    app.router.add_get("/v1/models", models)
    return app
