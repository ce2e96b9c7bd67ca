"""Cache and scheduling mechanics through the running servers, seen in /metrics and usage."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.text.probes import NEEDLE_FACT, NEEDLE_QUESTION
from tests.conftest import SimServers
from tests.support.simreq import stream_facts

MODEL = "sim-27b"
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
)


async def post(server: TestServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url(path), json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = orjson.loads(await resp.read())
        return data


async def complete(server: TestServer, ids: list[int], **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, **extra}
    return await post(server, "/v1/completions", body)


async def metrics(server: TestServer) -> dict[str, float]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/metrics")) as resp,
    ):
        text = await resp.text()
    out: dict[str, float] = {}
    for name in COUNTERS:
        m = re.search(rf'^{re.escape(name)}{{model_name="{MODEL}"}} (\S+)$', text, re.M)
        assert m, name
        out[name] = float(m.group(1))
    info = re.search(r'^sessiongen_sim_info\{.*time_scale="([^"]+)".*\} 1\.0$', text, re.M)
    assert info
    out["time_scale"] = float(info.group(1))
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> list[float]:
    return [after[k] - before[k] for k in COUNTERS]


async def test_counters_move_by_the_hit_tokens(sim_servers: SimServers) -> None:
    a, b = await sim_servers()
    prompt = list(range(5000))
    a0, b0 = await metrics(a), await metrics(b)
    await complete(a, prompt)
    a1 = await metrics(a)
    assert delta(a1, a0) == [5000, 0, 5000, 0]
    local = await complete(a, prompt + list(range(90_000, 90_032)))
    a2 = await metrics(a)
    # 312 whole 16-token blocks hit locally; the pool's 3 chunks lie within that.
    assert delta(a2, a1) == [5032, 4992, 5032, 0]
    assert local["sim"]["local_hit_tokens"] == 4992
    cross = await complete(b, prompt + list(range(91_000, 91_032)))
    assert delta(await metrics(b), b0) == [5032, 0, 5032, 3 * 1568]
    assert cross["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 1568


async def test_pool_off_gives_no_cross_replica_hits_and_no_external_queries(
    sim_servers: SimServers,
) -> None:
    a, b = await sim_servers(shared_cache=False)
    prompt = list(range(5000))
    await complete(a, prompt)
    b0 = await metrics(b)
    out = await complete(b, [*prompt, 7])
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert delta(await metrics(b), b0) == [5001, 0, 0, 0]
    assert (await metrics(a))["vllm:external_prefix_cache_queries_total"] == 0


async def test_local_cache_first_then_pool_beyond_it(sim_servers: SimServers) -> None:
    a, b = await sim_servers()
    head = list(range(3200))  # 200 blocks
    longer = head + list(range(50_000, 53_200))  # 6,400 tokens: 4 whole chunks
    await complete(a, head)
    await complete(b, longer)
    out = await complete(a, [*longer, 1, 2, 3])
    assert out["sim"]["local_hit_tokens"] == 3200
    assert out["sim"]["pool_hit_tokens"] == 4 * 1568 - 3200
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * 1568


async def test_reset_and_config_routes(sim_servers: SimServers) -> None:
    a, b = await sim_servers()
    prompt = list(range(4000))
    await complete(a, prompt)
    await post(a, "/sim/reset", {})
    again = await complete(a, prompt)
    assert again["sim"]["local_hit_tokens"] == 0 and again["sim"]["pool_hit_tokens"] == 2 * 1568
    await post(a, "/sim/reset", {"pool": True})
    assert (await complete(b, prompt))["sim"]["pool_hit_tokens"] == 0
    config = await post(b, "/sim/config", {"shared_cache": False, "time_scale": 0.002})
    assert config["shared_cache"] is False and config["time_scale"] == 0.002
    assert (await complete(a, [*prompt, 5]))["sim"]["pool_hit_tokens"] == 0
    assert (await metrics(a))["time_scale"] == 0.002  # config is process-wide
    async with (
        aiohttp.ClientSession() as session,
        session.post(a.make_url("/sim/config"), json={"shared": 1}) as resp,
    ):
        assert resp.status == 400


async def test_a_request_arriving_during_a_step_waits_for_its_end(
    sim_servers: SimServers,
) -> None:
    profile = SimProfile(time_scale=0.2)  # an 8k prefill: ~0.23 s wall, >> arrival jitter
    a, b = await sim_servers(profile)
    first, second = list(range(8000)), list(range(100_000, 108_000))
    same = await asyncio.gather(complete(a, first), complete(a, second))
    queued = max(r["sim"]["modeled_queue_s"] for r in same)
    cold = min(r["sim"]["modeled_ttft_s"] for r in same)
    # The later one arrived while the other's one-step prefill (8,000 tokens, within
    # the 8,192-token budget) ran, and joined the next step (about 1.1 modeled s).
    assert queued > 0.8 * cold
    apart = await asyncio.gather(
        complete(a, list(range(200_000, 208_000))), complete(b, list(range(300_000, 308_000)))
    )
    assert all(r["sim"]["modeled_queue_s"] == 0 for r in apart)


def needle_messages(filler_words: int) -> list[dict[str, str]]:
    filler = " The river ran past the stone." * (filler_words // 6)
    context = filler + NEEDLE_FACT.format(vault=41, code=9317) + filler
    return [
        {"role": "user", "content": context},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": NEEDLE_QUESTION.format(vault=41)},
    ]


async def answer(server: TestServer, messages: list[dict[str, str]]) -> tuple[str, int]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    out = await post(server, "/v1/chat/completions", body)
    return out["choices"][0]["message"]["content"], out["sim"]["pool_hit_tokens"]


async def test_needle_answered_and_pool_corruption_planted(sim_servers: SimServers) -> None:
    messages = needle_messages(4000)
    healthy_a, healthy_b = await sim_servers()
    assert (await answer(healthy_a, messages))[0].startswith("9317")
    text, pool_hit = await answer(healthy_b, messages)
    assert pool_hit > 0 and text.startswith("9317")

    faulty = SimProfile(time_scale=0.001, pool_corruption=1.0)
    bad_a, bad_b = await sim_servers(faulty)
    assert (await answer(bad_a, messages))[0].startswith("9317")  # cold: no pool, no fault
    text, pool_hit = await answer(bad_b, messages)
    assert pool_hit > 0 and not text.startswith("9317")
    assert (await answer(bad_a, messages))[0].startswith("9317")  # local hit: still right


async def scrape(server: TestServer) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/metrics")) as resp,
    ):
        return await resp.text()


def sample(text: str, name: str) -> float:
    m = re.search(rf'^{re.escape(name)}{{model_name="{MODEL}"}} (\S+)$', text, re.M)
    assert m, name
    return float(m.group(1))


async def test_ttft_histogram_observes_modeled_seconds(sim_servers: SimServers) -> None:
    a, _ = await sim_servers(SimProfile(time_scale=0.001))
    out = await complete(a, list(range(8000)))
    text = await scrape(a)
    assert sample(text, "vllm:time_to_first_token_seconds_count") == 1
    # Modeled (about 1.16 s), not wall (about 1.2 ms).
    observed = sample(text, "vllm:time_to_first_token_seconds_sum")
    assert observed == out["sim"]["modeled_ttft_s"] and 1.0 < observed < 1.3


async def test_running_and_waiting_gauges(sim_servers: SimServers) -> None:
    a, _ = await sim_servers(SimProfile(time_scale=0.1))  # each 8k prefill: ~0.12 s wall
    tasks = [asyncio.create_task(complete(a, list(range(k, k + 8000)))) for k in (0, 10**6)]
    seen: set[tuple[float, float]] = set()
    while not all(t.done() for t in tasks):
        text = await scrape(a)
        running = sample(text, "vllm:num_requests_running")
        seen.add((running, sample(text, "vllm:num_requests_waiting")))
    await asyncio.gather(*tasks)
    assert (1.0, 1.0) in seen  # one in the step under way, one waiting for its end
    text = await scrape(a)
    assert sample(text, "vllm:num_requests_running") == 0
    assert sample(text, "vllm:num_requests_waiting") == 0


async def decode_span(server: TestServer, start: int, tokens: int) -> float:
    """The simulator's modeled seconds from the first to the last token of a request."""
    body = {
        "model": MODEL,
        "prompt": list(range(start, start + 1000)),
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    facts: dict[str, Any] = {}
    chunks = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url("/v1/completions"), json=body) as resp,
    ):
        async for line in resp.content:
            if line.startswith(b'data: {"id"'):
                obj = orjson.loads(line[6:])
                chunks += bool(obj["choices"])
                facts = obj.get("sim", facts)
    assert chunks == tokens
    return float(facts["modeled_e2e_s"] - facts["modeled_ttft_s"])


async def test_decode_pace_follows_itl_and_slows_with_batch(sim_servers: SimServers) -> None:
    profile = SimProfile(
        time_scale=1.0,
        prefill_s_per_ktok=0.001,  # prefills too short to keep the decodes apart
        attn_s_per_ktok2=0.0,
        itl_base_s=0.005,
        itl_per_ktok_s=0.0,
        itl_per_batch_s=0.005,
    )
    a, _ = await sim_servers(profile)
    alone = await decode_span(a, 0, 21)
    assert alone == pytest.approx(20 * 0.005, rel=1e-9)  # modeled: exactly 20 ITLs
    together = await asyncio.gather(decode_span(a, 10**5, 21), decode_span(a, 2 * 10**5, 21))
    # While both decode, each step takes 0.010 s instead of 0.005 s.
    assert max(together) > 1.5 * alone


async def test_pool_serves_a_prefix_only_once_its_prefill_has_ended(
    sim_servers: SimServers,
) -> None:
    # 32k prefill: about 2.5 s wall at time scale 0.5, time to admit the second request
    # while it runs even on a busy machine (at 0.1, 0.5 s, a load of 7 on 2 cores once
    # admitted it after the prefill had ended).
    a, b, c = await sim_servers(SimProfile(time_scale=0.5, replicas=3))
    context = list(range(32_000))
    first = asyncio.create_task(complete(a, context))
    while sample(await scrape(a), "vllm:num_requests_running") < 1:
        await asyncio.sleep(0)
    during = await complete(b, [*context, 1])  # admitted within a's prefill
    assert during["sim"]["pool_hit_tokens"] == 0  # a's chunks are not computed yet
    await first
    after = await complete(c, [*context, 2])
    assert after["sim"]["pool_hit_tokens"] == 32_000 // 1568 * 1568


async def test_four_replicas_share_one_pool(sim_servers: SimServers) -> None:
    servers = await sim_servers(SimProfile(time_scale=0.001, replicas=4))
    assert len(servers) == 4
    context = list(range(10_000))
    await complete(servers[0], context)
    for i, server in enumerate(servers[1:], start=1):
        out = await complete(server, [*context, i])
        assert out["sim"]["replica"] == i
        assert out["sim"]["pool_hit_tokens"] == 10_000 // 1568 * 1568
        counters = await metrics(server)
        assert counters["vllm:external_prefix_cache_hits_total"] == 10_000 // 1568 * 1568


async def test_preemptions_and_kv_usage_reach_metrics_and_usage(sim_servers: SimServers) -> None:
    # 64 blocks of 16 tokens; two requests of 400 + 300 tokens need 44 blocks each.
    profile = SimProfile(time_scale=0.1, local_cache_tokens=1024, max_model_len=1024)
    a, _ = await sim_servers(profile)
    tasks = [asyncio.create_task(stream_facts(a, list(range(k, k + 400)), 300)) for k in (0, 10**5)]
    usage: list[float] = []
    while not all(t.done() for t in tasks):
        usage.append(sample(await scrape(a), "vllm:kv_cache_usage_perc"))
    facts = await asyncio.gather(*tasks)
    text = await scrape(a)
    preempted = sum(f["preemptions"] for f in facts)
    assert preempted >= 1
    assert sample(text, "vllm:num_preemptions_total") == preempted
    assert max(usage) > 0.5 and sample(text, "vllm:kv_cache_usage_perc") == 0
    assert all(f["kv_blocks_total"] == 64 for f in facts)
    later = max(facts, key=lambda f: f["kv_blocks_in_use_at_admission"])
    assert later["kv_blocks_in_use_at_admission"] >= 400 // 16  # the other one's prompt


async def test_the_answer_is_reused_by_the_next_turn_on_the_same_replica(
    sim_servers: SimServers,
) -> None:
    a, _ = await sim_servers(SimProfile(time_scale=0.001))
    first = [{"role": "user", "content": "Tell me about rivers. " * 200}]
    body = {"model": MODEL, "messages": first, "max_tokens": 40, "ignore_eos": True}
    turn1 = await post(a, "/v1/chat/completions", body)
    answer = turn1["choices"][0]["message"]["content"]
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    turn2 = await post(a, "/v1/chat/completions", {**body, "messages": second})
    prompt1 = turn1["usage"]["prompt_tokens"]
    # The answer's blocks were cached under the keys of prompt + output: 39 of its 40
    # tokens are in the KV cache, so at least one more whole block hits.
    assert turn2["sim"]["local_hit_tokens"] >= (prompt1 // 16 + 2) * 16


async def test_a_client_that_goes_away_frees_its_request(sim_servers: SimServers) -> None:
    a, _ = await sim_servers(SimProfile(time_scale=0.05))
    body = {
        "model": MODEL,
        "prompt": list(range(2000)),
        "max_tokens": 5000,  # about 60 modeled s of decode: 3 s wall
        "ignore_eos": True,
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(a.make_url("/v1/completions"), json=body) as resp,
    ):
        await resp.content.readline()  # the first token is out
        assert sample(await scrape(a), "vllm:num_requests_running") == 1
    while sample(await scrape(a), "vllm:num_requests_running") != 0:
        await asyncio.sleep(0.01)  # the server notices at its next write
    assert sample(await scrape(a), "vllm:kv_cache_usage_perc") == 0
