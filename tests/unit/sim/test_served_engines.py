"""The served simulator gives the same account on both engines: one workload served by
the compiled engine and by the Python one, through the HTTP apps, every request's
modeled facts equal to the bit.

Every arrival is stated ahead of the engine's clock and every request names its noise
key, so what the engine sees does not depend on when the handlers ran; the workload
shares three documents across two replicas (local and pool hits), on caches that hold
two requests and not their answers (eviction, preemption, queueing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import compiled
from sessiongen.sim.server import make_apps
from tests.unit.sim.test_arrivals import complete

Serve = Callable[[web.Application], Awaitable[TestServer]]

#: The facts that wall time does not touch (``sim`` on each response).
MODELED = (
    "replica", "local_hit_tokens", "pool_hit_tokens", "modeled_ttft_s", "modeled_queue_s",
    "preemptions", "kv_blocks_in_use_at_admission", "kv_blocks_total",
    "running_at_admission", "waiting_at_admission", "modeled_e2e_s", "modeled_arrival_s",
    "modeled_end_s", "arrival_late_s",
)  # fmt: skip
REQUESTS = 24
#: Modeled: 3 s wall at the time scale below, for every handler to come in on a busy machine.
FIRST_S = 60.0


pytestmark = pytest.mark.usefixtures("compiled_engine")


def _prompt(i: int) -> list[int]:
    document = [1000 * (i % 3) + t for t in range(3000)]  # three shared documents
    return document + [50_000 + 1000 * i + t for t in range(900)]


async def _one(server: TestServer, i: int) -> dict[str, Any]:
    output = 100 + 100 * (i % 4)
    arrival = FIRST_S + 0.15 * i
    return await complete(server, _prompt(i), arrival, max_tokens=output, key=f"7/0/{i}/1")


async def _serve(serve: Serve, engine: compiled.Engine, mode: str) -> list[dict[str, Any]]:
    profile = SimProfile(
        time_scale=0.05,
        local_cache_tokens=8192,
        max_model_len=8192,
        max_num_seqs=3,
        prefill_noise_sigma=0.2,
        pool_load_mode=mode,  # type: ignore[arg-type]
    )
    servers = [await serve(app) for app in make_apps(profile, "sim-27b", True, engine=engine)]
    async with (
        aiohttp.ClientSession() as session,
        session.get(servers[0].make_url("/sim/config")) as resp,  # starts the clock
    ):
        config = orjson.loads(await resp.read())
    assert config["engine"] == engine
    assert config["modeled_now_s"] < FIRST_S
    facts = await asyncio.gather(*(_one(servers[i % 2], i) for i in range(REQUESTS)))
    return [{key: f.get(key) for key in MODELED} for f in facts]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_served_workload_gives_the_same_facts_on_both_engines(
    aiohttp_server: Serve, mode: str
) -> None:
    python = await _serve(aiohttp_server, "python", mode)
    native = await _serve(aiohttp_server, "compiled", mode)
    assert all(f["arrival_late_s"] == 0.0 for f in python + native), "an arrival came late"
    # The paths worth comparing were taken: local and pool hits, queueing, preemption.
    for key in ("local_hit_tokens", "pool_hit_tokens", "waiting_at_admission", "preemptions"):
        assert any(f[key] > 0 for f in python), key
    for i, (p, c) in enumerate(zip(python, native, strict=True)):
        assert c == p, f"request {i} differs"
