"""A real pair's structure from its run's manifest: what a fitted profile takes as given.

Timing parameters are fitted (:mod:`.fit`); the structure is read: how many replicas,
vLLM's KV block and KV cache capacity, its scheduler's limits (token budget per step,
requests running at once), the longest request, LMCache's chunk and pool size. These
decide where prefixes are cut (blocks, chunks), when LRU evicts, and how requests that
arrive together share a step, so a profile that predicts one pair must carry them.

Sources, best first:

1. the engine facts each replica told when its block opened (``engine`` in the
   manifest's target: per block for managed pairs, per server for endpoints; see
   :mod:`sessiongen.client.engine`);
2. the managed spec: ``chunk_size``, ``pool_size_gb``, ``max_model_len``, scheduler
   flags in ``vllm_args``;
3. vLLM's own defaults for the device: 128-token blocks on CPU
   (``vllm/platforms/cpu.py``), 16 on CUDA; on CPU the API server's
   ``max_num_batched_tokens = 2048`` and ``max_num_seqs = 128`` per engine
   (``EngineArgs.get_batch_defaults``, vLLM 0.32). GPU scheduler defaults depend on
   the device's memory, so none is assumed there.

What none of them tell (LMCache's chunk behind ``--endpoints``, say) is listed by
:func:`unknown`, so ``sessiongen fit`` can say which keys to set by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from sessiongen.records.meta import RunMeta

#: Structural profile keys, in the order a profile file lists them.
STRUCTURE_KEYS = (
    "replicas",
    "local_block_tokens",
    "local_cache_tokens",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "pool_chunk_tokens",
    "pool_capacity_gib",
)

#: vLLM 0.32's scheduler defaults for the OpenAI server on CPU, per engine.
CPU_BATCH_DEFAULTS = {"max_num_batched_tokens": 2048, "max_num_seqs": 128}
#: vLLM's KV block size by device when the replicas did not tell it.
DEFAULT_BLOCK_TOKENS = {"cpu": 128, "cuda": 16}

_ENGINE_KEYS = {
    "local_block_tokens": "block_size",
    "local_cache_tokens": "kv_cache_tokens",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "max_model_len": "max_model_len",
}
_FLAGS = {
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-num-seqs": "max_num_seqs",
    "--block-size": "local_block_tokens",
}


def engines(meta: RunMeta) -> list[Mapping[str, object]]:
    """Every replica's engine facts the manifest holds (managed blocks, endpoints)."""
    target = meta.target
    out: list[Mapping[str, object]] = []
    for block in target.get("blocks") or []:
        out += [e for e in block.get("engine") or [] if isinstance(e, dict)]
    for server in target.get("servers") or []:
        engine = server.get("engine") if isinstance(server, dict) else None
        if isinstance(engine, dict) and engine:
            out.append(engine)
    return out


def _flag_values(args: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        key = _FLAGS.get(name)
        value = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
        if key is not None and value.isdigit():
            out[key] = int(value)
    return out


def structure(meta: RunMeta, *, kv_bytes_per_token: int | None = None) -> dict[str, float]:
    """The structural profile keys this run tells (see the module doc), each a number
    (counts are whole); with the model's
    KV bytes per token, a CPU replica's KV cache follows from ``VLLM_CPU_KVCACHE_SPACE``
    (GiB) where the replicas did not tell it."""
    target = meta.target
    profile = target.get("profile") or {}
    if profile:  # a simulated or planned run: its profile is the structure
        return {k: profile[k] for k in STRUCTURE_KEYS if k in profile}
    spec = target.get("spec") or {}
    out: dict[str, float] = {}
    replicas = target.get("replicas") or len(target.get("endpoints") or []) or None
    if replicas:
        out["replicas"] = int(replicas)
    # Where replicas differ (they should not), the smallest is what a request can count on.
    told = engines(meta)
    for key, fact in _ENGINE_KEYS.items():
        values = [v for e in told if isinstance(v := e.get(fact), int)]
        if values:
            out[key] = min(values)
    flags = _flag_values(spec.get("vllm_args") or ())
    device = spec.get("device")
    for key, value in flags.items():
        out.setdefault(key, value)
    if "max_model_len" in spec:
        out.setdefault("max_model_len", int(spec["max_model_len"]))
    if device in DEFAULT_BLOCK_TOKENS:
        out.setdefault("local_block_tokens", DEFAULT_BLOCK_TOKENS[device])
    if device == "cpu":
        for key, value in CPU_BATCH_DEFAULTS.items():
            out.setdefault(key, value)
        space = (spec.get("env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
        if kv_bytes_per_token and space is not None and "local_cache_tokens" not in out:
            with contextlib.suppress(ValueError):  # not a number: vLLM's own error
                out["local_cache_tokens"] = int(float(space) * (1 << 30)) // kv_bytes_per_token
    if "chunk_size" in spec:
        out["pool_chunk_tokens"] = int(spec["chunk_size"])
    if "pool_size_gb" in spec:  # LMCache's --l1-size-gb counts GiB (1 << 30 bytes)
        out["pool_capacity_gib"] = float(spec["pool_size_gb"])
    return out


def unknown(found: Mapping[str, object]) -> list[str]:
    """Structural keys the run did not tell."""
    return [k for k in STRUCTURE_KEYS if k not in found]
