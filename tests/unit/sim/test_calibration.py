"""The default profile reproduces the study's TTFT table within 10%."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from aiohttp.test_utils import TestServer

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import model
from sessiongen.sim.output import word_ids
from sessiongen.text.tokenize import cl100k
from tests.conftest import SimServers
from tests.support.simreq import stream_facts
from tests.support.study import (
    PROBES,
    STUDY_TTFT_S,
    calibration_table,
    probe_hits,
    probe_prompts,
    probe_ttft,
    run_probes,
)

TOLERANCE = 0.10


@pytest.mark.parametrize("n", sorted(STUDY_TTFT_S))
@pytest.mark.parametrize("probe", PROBES)
def test_pure_model_matches_study_cell(n: int, probe: str) -> None:
    modeled, study = calibration_table(SimProfile())[n][probe]  # type: ignore[index]
    assert modeled == pytest.approx(study, rel=TOLERANCE)


def test_probe_hits_follow_block_and_chunk_alignment() -> None:
    hits = probe_hits(SimProfile(), 128_000)
    assert hits["cold"] == (128_000, 0, 0)
    assert hits["local"] == (128_032, 128_000, 0)  # 8,000 whole 16-token blocks
    assert hits["cross"] == (128_032, 0, 81 * 1568)  # 81 whole chunks, tail recomputed


@pytest.mark.parametrize("n", sorted(STUDY_TTFT_S))
def test_scheduler_alone_takes_exactly_the_model_ttft(n: int) -> None:
    """One request alone on its replica: the step-by-step engine (chunked prefill at
    8,192 tokens a step, pool load over the link) adds up to the pure model's TTFT."""
    profile = SimProfile()
    expected = probe_ttft(profile, n)
    for probe, result in run_probes(profile, n).items():
        assert result.ttft_s == pytest.approx(expected[probe], rel=1e-12, abs=1e-12)
        assert result.queue_s == 0 and result.preemptions == 0


def test_slowdown_multiplies_every_modeled_latency() -> None:
    base = SimProfile()
    slow = dataclasses.replace(base, slowdown=1.5)
    for args in ((128_032, 128_000, 0), (128_032, 0, 127_008), (1000, 0, 0)):
        assert model.request_timing(slow, *args).ttft_s == pytest.approx(
            1.5 * model.request_timing(base, *args).ttft_s
        )
    assert model.itl_s(slow, 5000, 3) == pytest.approx(1.5 * model.itl_s(base, 5000, 3))


def test_itl_grows_with_context_and_batch() -> None:
    p = SimProfile()
    assert model.itl_s(p, 100_000, 1) > model.itl_s(p, 1_000, 1)
    assert model.itl_s(p, 1_000, 8) > model.itl_s(p, 1_000, 1)


def test_hit_overhead_is_flat_outside_its_table_and_zero_without_local_hit() -> None:
    p = SimProfile()
    assert model.hit_overhead_s(p, 0) == 0.0
    assert model.hit_overhead_s(p, 10**7) == pytest.approx(p.hit_overhead_s[-1])
    mid = (p.hit_overhead_tokens[1] + p.hit_overhead_tokens[2]) // 2
    assert p.hit_overhead_s[1] < model.hit_overhead_s(p, mid) < p.hit_overhead_s[2]


# --- End to end: the same cells through the running servers -------------------------
# These check what the servers model, exactly: the modeled TTFT each one reports equals
# the pure model's cell. How closely the wall clock follows the model on a given machine
# is measured, not asserted: bench/sim_fidelity.py prints it.


async def test_running_servers_model_every_cell_exactly(sim_servers: SimServers) -> None:
    """All 12 cells through the servers: each reports the pure model's TTFT and hits."""
    profile = SimProfile(time_scale=0.0005)  # the wall clock plays no part here
    a, b = await sim_servers(profile)
    for n in STUDY_TTFT_S:
        expected, hits = probe_ttft(profile, n), probe_hits(profile, n)
        prompts = probe_prompts(n)
        async with aiohttp.ClientSession() as session:
            for server in (a, b):
                await session.post(server.make_url("/sim/reset"), json={"pool": True})
        for probe, server in (("cold", a), ("local", a), ("cross", b)):
            facts = await stream_facts(server, prompts[probe].tolist())
            _tokens, local, pool = hits[probe]
            assert (facts["local_hit_tokens"], facts["pool_hit_tokens"]) == (local, pool)
            assert facts["modeled_queue_s"] == 0
            # Loop-clock arithmetic (start + busy x scale) leaves float rounding only.
            assert facts["modeled_ttft_s"] == pytest.approx(expected[probe], rel=1e-7)


# --- The simulator's own work does not enter modeled time ----------------------------


def prose(tokens: int, seed: int) -> str:
    """Text of exactly ``tokens`` cl100k tokens, no two segments alike (defeats the memo)."""
    rng = np.random.default_rng(seed)
    words = [cl100k().decode([int(t)]) for t in word_ids()]
    return "".join(words[i] for i in rng.integers(0, len(words), tokens))


async def chat_facts(server: TestServer, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {
        "model": "sim-27b",
        "messages": messages,
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url("/v1/chat/completions"), data=orjson.dumps(body)) as resp,
    ):
        facts: dict[str, Any] = {}
        async for line in resp.content:
            if b'"usage"' in line:
                facts = orjson.loads(line[6:])["sim"]
    return facts


async def test_own_work_does_not_enter_modeled_time_of_a_128k_prompt(
    sim_servers: SimServers,
) -> None:
    """Cold, then a local hit, of a 128k-token chat prompt.

    Tokenizing and hashing 128k tokens takes the simulator tens of milliseconds of its
    own; deadlines count from the request's arrival, so its modeled TTFT is the model's
    whatever that work cost: the target it schedules is modeled TTFT x time scale.
    """
    profile = SimProfile(time_scale=0.001)
    a, _ = await sim_servers(profile)
    context = prose(128_000, seed=1)
    turn1 = [{"role": "user", "content": context}]
    cold = await chat_facts(a, turn1)
    turn2 = [*turn1, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Q?"}]
    hit = await chat_facts(a, turn2)
    for facts in (cold, hit):
        assert facts["own_work_s"] > 0
        assert facts["target_ttft_s"] == pytest.approx(facts["modeled_ttft_s"] * 0.001)
    n_cold = cold["modeled_ttft_s"]
    # The chat template and word boundaries add a little to the 128k context.
    assert model.request_timing(profile, 128_000, 0, 0).ttft_s < n_cold
    assert n_cold < model.request_timing(profile, 130_000, 0, 0).ttft_s
    assert cold["local_hit_tokens"] == 0 and hit["local_hit_tokens"] > 127_000
    assert hit["modeled_ttft_s"] < 0.6 < n_cold / 10
