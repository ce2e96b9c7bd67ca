"""Modeled arrivals through the running server: a request stating a modeled arrival the
engine has already passed is taken late, and its facts and its record say by how much."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from sessiongen.client.result import Result
from sessiongen.replay.runner import _server_fact_s
from sessiongen.sim.noise import MAX_KEY_CHARS
from sessiongen.sim.wire import ARRIVAL_HEADER, REQUEST_KEY_HEADER
from tests.conftest import SimServers


async def complete(
    server: TestServer,
    ids: list[int],
    arrival_s: float | None,
    *,
    max_tokens: int = 20,
    key: str | None = None,
) -> dict[str, Any]:
    """The ``sim`` facts of one non-streaming request, stating ``arrival_s`` and its noise
    ``key`` if given."""
    body = {"model": "sim-27b", "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True}
    headers = {} if arrival_s is None else {ARRIVAL_HEADER: repr(arrival_s)}
    if key is not None:
        headers[REQUEST_KEY_HEADER] = key
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url("/v1/completions"), json=body, headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        facts: dict[str, Any] = orjson.loads(await resp.read())["sim"]
        return facts


async def modeled_now(server: TestServer) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/sim/config")) as resp,
    ):
        return float((await resp.json())["modeled_now_s"])


async def test_an_arrival_the_engine_has_passed_is_late_by_the_difference(
    sim_servers: SimServers,
) -> None:
    a, _ = await sim_servers()  # 1,000x faster than modeled: 50 modeled s are 50 ms
    unstated = await complete(a, list(range(300)), None)
    assert unstated["arrival_late_s"] is None  # nothing stated: nothing to be late against
    first = await complete(a, list(range(3000, 3300)), await modeled_now(a) + 50.0)
    assert first["arrival_late_s"] == 0.0  # stated ahead of the engine: on time
    # The engine has processed the first request's last token, so its clock is at least
    # there: a second request stating the first's arrival comes at least its e2e late.
    start, end = first["modeled_arrival_s"], first["modeled_end_s"]
    late = await complete(a, list(range(1000, 1300)), start)
    assert late["arrival_late_s"] >= end - start > 0

    # The record's column is that lateness in wall seconds (modeled x time scale).
    res = Result(usage_chunk={"sim": late})
    recorded = _server_fact_s(res, "arrival_late_s")
    assert recorded is not None
    assert abs(recorded - late["arrival_late_s"] * late["time_scale"]) < 1e-12
    assert _server_fact_s(Result(usage_chunk={"sim": first}), "arrival_late_s") == 0.0
    assert _server_fact_s(Result(usage_chunk={"sim": unstated}), "arrival_late_s") is None


async def test_an_empty_or_too_long_request_key_is_refused_naming_the_header(
    sim_servers: SimServers,
) -> None:
    a, _ = await sim_servers()
    body = {"model": "sim-27b", "prompt": list(range(50)), "max_tokens": 5}
    for key, status in (("x" * (MAX_KEY_CHARS + 1), 400), ("", 400), ("7/0/3/2", 200)):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                a.make_url("/v1/completions"), json=body, headers={REQUEST_KEY_HEADER: key}
            ) as resp,
        ):
            assert resp.status == status, key
            if status == 400:
                assert REQUEST_KEY_HEADER in (await resp.json())["error"]["message"]
