"""The compiled engine (``sessiongen/sim/_core.pyx``) gives exactly what the Python engine
gives: every shipped scenario the planner accepts, in shape and exact mode, and random
workloads on caches small enough to evict, preempt and queue, with the pool's loads
synchronous and asynchronous, with and without service-time noise. Equal means equal:
every record's every column, every modeled time to the bit.

The compiled engine must be built here (``pip install -e .`` builds it): these tests fail
when it is missing, unless ``SESSIONGEN_ENGINE=python`` says the Python engine was chosen.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.virtual import Tokens, plan_run
from sessiongen.errors import MissingDependencyError, UserError
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import cache, compiled
from sessiongen.sim.virtual import Arrival, RequestResult, VirtualDriver
from tests.unit.capacity.test_plan_paths import PLANNABLE, _small

pytestmark = pytest.mark.usefixtures("compiled_engine")


def _plan(path: Path, tokens: Tokens, engine: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setenv(compiled.ENV, engine)
        m.setattr(os, "urandom", lambda n: b"\x07" * n)  # the planner's salt
        return plan_run(scenario.load(path, _small(path)), run_id="engines", tokens=tokens)


@pytest.mark.parametrize("tokens", ["shape", "exact"])
@pytest.mark.parametrize("path", PLANNABLE, ids=lambda p: p.stem)
def test_every_shipped_scenario_plans_the_same_on_both_engines(
    path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = _plan(path, tokens, "python", monkeypatch)
    native = _plan(path, tokens, "compiled", monkeypatch)
    assert python.manifest["target"]["engine"] == "python"
    assert native.manifest["target"]["engine"] == "compiled"
    assert python.requests.height > 0
    assert native.requests.equals(python.requests), f"{path.name} ({tokens}) differs"


def test_the_cache_pressure_scenario_at_full_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """pressure32k as shipped: 8 sessions in flight on caches that hold three, so blocks
    are evicted and prompts recomputed (the paths the small runs above touch least)."""
    path = Path(scenario.__file__).resolve().parents[2] / "scenarios" / "pressure32k.toml"
    frames = []
    for engine in ("python", "compiled"):
        with monkeypatch.context() as m:
            m.setenv(compiled.ENV, engine)
            m.setattr(os, "urandom", lambda n: b"\x07" * n)
            frames.append(plan_run(scenario.load(path), run_id="p", tokens="shape").requests)
    python, native = frames
    assert python.filter(pl.col("load_level") == 8)["local_hit_tokens"].sum() > 0
    assert native.equals(python)


# --- random workloads on the engine itself ------------------------------------------------


def _profile(rng: np.random.Generator) -> SimProfile:
    block = int(rng.choice([4, 8, 16]))
    cache_tokens = block * int(rng.integers(70, 400))
    return SimProfile(
        replicas=int(rng.integers(1, 4)),
        max_model_len=cache_tokens,
        max_num_batched_tokens=int(rng.choice([64, 256, 2048])),
        max_num_seqs=int(rng.choice([2, 4, 64])),
        local_block_tokens=block,
        local_cache_tokens=cache_tokens,
        pool_chunk_tokens=block * int(rng.choice([1, 2, 3])) + int(rng.choice([0, 0, 5])),
        pool_capacity_gib=float(rng.choice([1e-5, 1e-3, 1.0])),
        kv_bytes_per_token=int(rng.choice([1000, 16384])),
        pool_bandwidth_gbps=float(rng.choice([0.01, 1.0, 20.0])),
        pool_load_fixed_s=float(rng.choice([0.0, 0.01])),
        pool_store_s_per_gb=float(rng.choice([0.0, 0.5])),
        pool_load_mode=str(rng.choice(["sync", "async"])),  # type: ignore[arg-type]
        prefill_s_per_ktok=0.1 + float(rng.random()),
        attn_s_per_ktok2=float(rng.choice([0.0, 0.01])),
        hit_overhead_tokens=(0, 100, 1000),
        hit_overhead_s=(0.0, 0.01, float(rng.choice([0.02, 0.05]))),
        itl_base_s=0.01,
        itl_per_ktok_s=float(rng.choice([0.0, 1e-4])),
        itl_per_batch_s=float(rng.choice([0.0, 5e-4])),
        slowdown=float(rng.choice([1.0, 1.5])),
        prefill_noise_sigma=float(rng.choice([0.0, 0.0, 0.3])),
    )


def _workload(rng: np.random.Generator, p: SimProfile) -> list[Arrival]:
    """Requests that share prefixes (a few documents, extended turn by turn), some with
    answers whose blocks are cached, arriving together and apart. Half the prompts are
    extensions of one key chain per document, whose keys then come in two pieces (a
    shared prefix and their own, :attr:`KeyChain.segments`), as a planned session's do."""
    documents = [rng.integers(0, 1000, int(rng.integers(20, 600))) for _ in range(3)]
    chains = [
        cache.PromptKeys.of(doc, p.local_block_tokens, p.pool_chunk_tokens) for doc in documents
    ]
    out: list[Arrival] = []
    t = 0.0
    for i in range(int(rng.integers(5, 40))):
        which = int(rng.integers(0, len(documents)))
        doc = documents[which]
        extra = rng.integers(0, 1000, int(rng.integers(1, 200)))
        prompt: Any
        if rng.random() < 0.5:
            prompt = chains[which].extend(extra)
            if rng.random() < 0.5:  # later turns extend this one
                chains[which] = prompt
            size = prompt.tokens
        else:
            prompt = np.concatenate((doc[: int(rng.integers(1, len(doc) + 1))], extra))
            size = len(prompt)
        longest = p.local_cache_tokens - size - p.local_block_tokens
        if longest < 1 or size + 1 > p.max_model_len:
            continue
        tokens = int(rng.integers(1, min(60, longest) + 1))
        answer = rng.integers(0, 1000, tokens) if rng.random() < 0.5 else None
        t += float(rng.choice([0.0, 0.0, rng.exponential(0.2)]))
        replica = int(rng.integers(0, p.replicas))
        out.append(Arrival(t, replica, prompt, tokens, output_ids=answer, tag=i))
    return out


def _run(p: SimProfile, work: list[Arrival], engine: str, **kwargs: Any) -> list[RequestResult]:
    driver = VirtualDriver(p, engine=engine, **kwargs)  # type: ignore[arg-type]
    for arrival in work:
        driver.submit(arrival)
    return driver.run()


@pytest.mark.parametrize("seed", range(200))
def test_random_workloads_give_the_same_results(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = _profile(rng)
    work = _workload(rng, p)
    options = {"shared_cache": bool(rng.random() < 0.7), "collapse": bool(rng.random() < 0.8)}
    python = _run(p, work, "python", **options)
    native = _run(p, work, "compiled", **options)
    assert len(python) == len(work)
    assert native == python


def test_random_workloads_reach_the_paths_they_are_for() -> None:
    """The random workloads above evict, preempt, load from the pool and queue (were they
    all gentle, the comparison would say little)."""
    seen = {"preempted": 0, "pool": 0, "queued": 0}
    for seed in range(60):
        rng = np.random.default_rng(seed)
        p = _profile(rng)
        work = _workload(rng, p)
        results = _run(p, work, "python", shared_cache=bool(rng.random() < 0.7))
        seen["preempted"] += sum(r.preemptions > 0 for r in results)
        seen["pool"] += sum(r.pool_hit_tokens > 0 for r in results)
        seen["queued"] += sum(r.queue_s > 0 for r in results)
    assert min(seen.values()) >= 5, seen


def test_the_compiled_chain_hash_gives_the_same_keys() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        size = int(rng.integers(1, 40))
        pieces = [rng.integers(0, 2**32, int(rng.integers(0, 300))) for _ in range(4)]
        keys = {}
        for engine in ("python", "compiled"):
            with pytest.MonkeyPatch.context() as m:
                m.setenv(compiled.ENV, engine)
                chain = cache.KeyChain.of(pieces[0], size)
                got = [chain.keys.copy()]
                for piece in pieces[1:]:
                    chain = chain.extend(piece)
                    got.append(chain.keys.copy())
            keys[engine] = got
        for a, b in zip(keys["python"], keys["compiled"], strict=True):
            assert np.array_equal(a, b)


def test_an_engine_nobody_built_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_load", lambda: (None, "not built (no module)"))
    with pytest.raises(MissingDependencyError, match="compiled engine is not built"):
        compiled.resolve("compiled")
    assert compiled.resolve("auto") == "python"
    monkeypatch.setenv(compiled.ENV, "fast")
    with pytest.raises(UserError, match="SESSIONGEN_ENGINE=fast"):
        compiled.resolve("auto")
