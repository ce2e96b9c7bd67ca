"""The simulated replica pair's timing profile: every modeled parameter, with its source.

Calibrated from the published figures in the study this project grew out of,
"Shared KV Caching for Replicated 27B Inference: Correctness Failures and Performance
Boundaries" (arXiv 2609.15021), as summarised in the project's calibration notes:
two replicas of a 27B hybrid model (NVFP4 weights, FP8 KV cache), one RTX PRO 6000
Blackwell GPU each, vLLM prefix cache on, one shared LMCache host-memory pool of
256 GiB with 1,568-token chunks, LRU.

The scheduler's parameters are vLLM's own (V1 engine, ``vllm serve``), with the sources
cited at each field; the defaults keep a request that is alone on its replica exactly
as fast as the study's table says (see ``sessiongen/sim/model.py``).

This module is pure data so that the scenario schema can embed it (``[target.sim]``)
without importing the simulator itself. Every field can be overridden with
``--set target.sim.NAME=VALUE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sessiongen.scenario.schema import spec


@dataclass(frozen=True)
class SimProfile:
    """Modeled-time parameters of one simulated replica set plus shared pool."""

    replicas: int = spec(2, ge=1, le=64, doc="number of simulated replicas")
    time_scale: float = spec(
        0.1, gt=0, le=1000, doc="wall seconds per modeled second (0.1 runs 10x faster)"
    )
    slowdown: float = spec(1.0, gt=0, doc="multiplies every modeled latency (regression tests)")
    max_model_len: int = spec(300_000, ge=2, doc="longest prompt + output accepted, tokens")
    # vLLM V1's scheduler, per replica (vllm/v1/core/sched/scheduler.py). Defaults are
    # what `vllm serve` picks on a GPU with >= 70 GiB that is not an A100 (the study's RTX
    # PRO 6000 has 96 GB): EngineArgs.get_batch_defaults, the same table in 0.10 to 0.12.
    # Chunked prefill is always on in V1; preemption is by recompute.
    max_num_batched_tokens: int = spec(
        8192, ge=1, doc="token budget of one engine step (prefill chunks plus decodes)"
    )
    max_num_seqs: int = spec(1024, ge=1, doc="most requests admitted (running) at once")
    # Per-replica GPU KV cache (vLLM): all of it, the blocks of running requests included;
    # finished requests' full blocks stay cached until evicted (LRU, tail blocks first).
    # 16-token blocks: vLLM's default on CUDA (CacheConfig; the CPU backend uses 128).
    local_block_tokens: int = spec(16, ge=1, doc="vLLM KV block size, tokens")
    local_cache_tokens: int = spec(
        600_000, ge=1, doc="GPU KV cache per replica, tokens (running requests + prefix cache)"
    )
    # Shared host-memory pool (LMCache): chunk granularity, LRU (study: 256 GiB, 1,568 tokens).
    # Chunks are stored as the prefill computes them (LMCache saves after each forward,
    # in whole chunks; generated tokens are not saved, save_decode_cache = false).
    # Loads from the pool share its bandwidth: one FIFO queue for all replicas (a load
    # takes pool_load_fixed_s, then waits for the link and holds it for its bytes).
    pool_chunk_tokens: int = spec(1568, ge=1, doc="LMCache chunk size, tokens")
    pool_capacity_gib: float = spec(256.0, gt=0, doc="shared pool capacity, GiB")
    kv_bytes_per_token: int = spec(16384, ge=1, doc="KV bytes per token moved from the pool")
    # Fitted to the cross-replica column (0.095, 0.221, 0.605, 0.790 s) *after* the
    # modeled recompute of the tail past the last whole chunk (192 to 1,024 tokens in
    # the probes, up to 0.37 s at 128k), which the study's "roughly 10 to 40 GB/s"
    # (cross minus local over the hit bytes) did not separate out. Least squares on the
    # four cells gives about 9.7 GB/s; 10 GB/s and 0.040 s keep every cell within 6%.
    pool_bandwidth_gbps: float = spec(
        10.0, gt=0, doc="pool-to-GPU load rate, GB/s, shared by every replica loading at once"
    )
    pool_load_fixed_s: float = spec(0.040, ge=0, doc="fixed cost of a pool lookup that hits")
    # Not in the study (its cold column is the pool-off arm's): what storing the KV a
    # step computes costs that step with the pool on. `sessiongen fit` measures it from
    # cold requests of both arms; 0 keeps the study's figures.
    pool_store_s_per_gb: float = spec(
        0.0,
        ge=0,
        doc="step time per GB of KV the step computes and stores in the pool (pool on), s",
    )
    # vLLM's KV connectors may load synchronously (the step that admits the request
    # waits for its load: every request in the batch waits too) or asynchronously (the
    # request waits apart, blocks allocated, and joins a later step once its KV is in).
    pool_load_mode: Literal["sync", "async"] = spec(
        "sync", doc="sync: a pool load holds the engine step | async: it runs beside the steps"
    )
    pool_corruption: float = spec(
        0.0,
        ge=0,
        le=1,
        doc="probability that a request served from the pool gets a corrupted output "
        "(a planted fault for correctness-detection tests)",
    )
    # Study fit to the cold column: TTFT_cold(n) ~ 0.136*(n/1000) + 8.7e-4*(n/1000)^2 s.
    prefill_s_per_ktok: float = spec(0.136, ge=0, doc="linear prefill cost, s per 1k tokens")
    attn_s_per_ktok2: float = spec(8.7e-4, ge=0, doc="attention prefill cost, s per (1k tok)^2")
    # Overhead of serving a request whose prefix hit the replica's own prefix cache,
    # interpolated linearly on the locally hit tokens (flat past the last point).
    # Derived from the local-hit column (0.050, 0.181, 0.484, 0.557 s at 8k, 32k, 128k,
    # 256k; "8k" is 8,000 tokens, which is where the cold fit matches) minus the modeled
    # prefill of the 32-token question and the first token; see
    # tests/support/study.py and tests/unit/sim/test_calibration.py.
    # It is keyed on *local* hits only: with 16-token blocks and 1,568-token chunks a
    # cross-replica probe recomputes up to 1,600 tail tokens that the local probe does
    # not (0.35 s at 128k), more than the study's whole cross-minus-local gap (0.12 s),
    # so an overhead paid by pool hits as well could not fit both columns.
    hit_overhead_tokens: tuple[int, ...] = spec(
        (0, 8000, 32000, 128000, 256000), ge=0, doc="local-hit sizes the overhead is given at"
    )
    hit_overhead_s: tuple[float, ...] = spec(
        (0.0, 0.033, 0.161, 0.454, 0.514),
        ge=0,
        repeats="the overhead may be flat between sizes",
        any_order="a fit may find it lower at a larger size; one value per size",
        doc="overhead at each of hit_overhead_tokens, modeled s",
    )
    # Decode: the decode part of one engine step, for a batch of sequences that each
    # sample a token: base + per_ktok * (their total context) / 1000 + per_batch * (batch - 1).
    # For one sequence this is the inter-token latency at its context.
    itl_base_s: float = spec(0.012, ge=0, doc="inter-token latency at empty context, batch 1")
    itl_per_ktok_s: float = spec(
        5e-5, ge=0, doc="extra step time per 1k tokens of context in the decode batch"
    )
    itl_per_batch_s: float = spec(5e-4, ge=0, doc="extra step time per other decode in the batch")
    # Service-time noise. A real engine never takes the same time twice (kernel timing, the
    # host's other work), and with sessions in flight together that decides who queues
    # behind whose long prefill. A deterministic model at zero think time locks the
    # sessions into one phase instead: every replicate of a plan queued the same turn
    # behind the same 12k prefill (bench/heldout_decision.py). Each request's prefill
    # compute is multiplied by a lognormal factor of mean 1 and this log-standard
    # deviation, drawn per request from the run's seed; `sessiongen fit` measures it from
    # the spread of cold requests around the fit. 0 keeps every time as it was.
    prefill_noise_sigma: float = spec(
        0.0,
        ge=0,
        le=2,
        doc="log-standard deviation of a lognormal factor (mean 1) on each request's "
        "prefill compute; 0: no noise",
    )
    profile: str | None = spec(
        None,
        doc="a profile file (sessiongen fit writes one) whose parameters apply under "
        "the keys set here",
    )

    def __post_init__(self) -> None:
        if len(self.hit_overhead_tokens) != len(self.hit_overhead_s):
            raise ValueError("hit_overhead_s: expected as many values as hit_overhead_tokens")
        # vLLM refuses to start when one request of max_model_len tokens cannot fit.
        if self.local_cache_tokens < self.max_model_len:
            raise ValueError(
                f"local_cache_tokens: expected >= max_model_len ({self.max_model_len}), "
                f"got {self.local_cache_tokens} (one request must fit in the KV cache)"
            )
