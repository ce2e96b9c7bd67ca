"""A pair's structure from a run's manifest: engine facts first, then spec, then defaults."""

from __future__ import annotations

from typing import Any

from sessiongen.analysis import structure
from sessiongen.records.meta import RunMeta

ENGINE = {"block_size": 128, "kv_cache_tokens": 1048576, "max_model_len": 32768}


def meta(target: dict[str, Any]) -> RunMeta:
    return RunMeta.from_manifest({"run_id": "r", "target": target})


def managed(**spec: Any) -> dict[str, Any]:
    base = {
        "device": "cpu",
        "chunk_size": 256,
        "pool_size_gb": 2.0,
        "max_model_len": 32768,
        "vllm_args": [],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "2"},
    }
    return {"kind": "managed", "replicas": 2, "spec": {**base, **spec}}


def test_a_managed_cpu_pair_without_engine_facts_falls_back_to_spec_and_defaults() -> None:
    found = structure.structure(meta(managed()), kv_bytes_per_token=2048)
    assert found == {
        "replicas": 2,
        "max_model_len": 32768,
        "local_block_tokens": 128,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "local_cache_tokens": (2 << 30) // 2048,
        "pool_chunk_tokens": 256,
        "pool_capacity_gib": 2.0,
    }
    assert structure.unknown(found) == []


def test_engine_facts_and_flags_win_over_defaults() -> None:
    target = managed(vllm_args=["--max-num-batched-tokens", "4096", "--max-num-seqs=8"])
    target["blocks"] = [{"engine": [dict(ENGINE, kv_cache_tokens=12672), ENGINE]}]
    found = structure.structure(meta(target), kv_bytes_per_token=2048)
    assert found["local_cache_tokens"] == 12672  # the smaller replica
    assert found["max_num_batched_tokens"] == 4096 and found["max_num_seqs"] == 8


def test_endpoints_tell_the_engine_but_not_the_pool() -> None:
    servers = [{"url": "http://a", "engine": ENGINE}, {"url": "http://b", "engine": ENGINE}]
    target = {"kind": "endpoints", "endpoints": ["http://a", "http://b"], "servers": servers}
    found = structure.structure(meta(target))
    assert found == {
        "replicas": 2,
        "local_block_tokens": 128,
        "local_cache_tokens": 1048576,
        "max_model_len": 32768,
    }
    assert structure.unknown(found) == [
        "max_num_batched_tokens",
        "max_num_seqs",
        "pool_chunk_tokens",
        "pool_capacity_gib",
    ]


def test_a_simulated_run_carries_its_profile() -> None:
    profile = {"replicas": 3, "local_block_tokens": 16, "prefill_s_per_ktok": 0.1}
    assert structure.structure(meta({"kind": "sim", "profile": profile})) == {
        "replicas": 3,
        "local_block_tokens": 16,
    }
