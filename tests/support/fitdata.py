"""Run folders for the capacity fit: probe sessions timed by the model, with known truth.

Each session is one context size: a cold turn, then the paths asked for (a local hit,
a cross-replica pool hit), one request at a time (``hit_source`` counters), so the fit
uses every request. The pool-off arm (block 1, by default; its noise drawn apart, so
the pool-on arm's draws do not depend on it) has the same sessions without the pool
turn; the pool-on arm's requests pay the pool's store cost for what they compute.
Times are the model's (:func:`sessiongen.sim.model.request_timing`)
times ``1 + noise * N(0, 1)``, seeded; the decode time (``e2e - ttft``) gets its own draw.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sessiongen.analysis.frames import rows_frame
from sessiongen.records.format import REQUEST_SCHEMA, SCHEMA_VERSION
from sessiongen.records.io import atomic_write_parquet
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import model

OUTPUT_TOKENS = 8


def probe_rows(
    profile: SimProfile,
    *,
    noise: float,
    seed: int,
    sizes: Sequence[int] = (2000, 4000, 8000, 16000),
    reps: int = 3,
    paths: Sequence[str] = ("cold", "local", "pool"),
    pool_sizes: Sequence[int] | None = None,
    run_id: str = "probe",
    server_error_s: float | None = None,
    arms: Sequence[str] = ("on", "off"),
) -> list[dict[str, Any]]:
    """One record per request. ``pool_sizes``: the context sizes whose sessions have the
    pool turn (default: all). ``server_error_s``: the run is simulated, the client's
    TTFT that much above the server's own (``server_ttft_s``)."""
    rngs = {"on": np.random.default_rng(seed), "off": np.random.default_rng([seed, 1])}
    rows: list[dict[str, Any]] = []
    for block, cache, size, rep in (
        (b, c, size, rep) for b, c in enumerate(arms) for size in sizes for rep in range(reps)
    ):
        session = f"{cache}-s{size}-{rep}"
        rng = rngs[cache]
        turns = [p for p in paths if p != "pool" or pool_sizes is None or size in pool_sizes]
        if cache == "off":
            turns = [p for p in turns if p != "pool"]
        for turn, path in enumerate(turns, start=1):
            n = size if path == "cold" else size + 32
            local = size if path == "local" else 0
            pool = size // 256 * 256 if path == "pool" else 0
            modeled = model.request_timing(profile, n, local, pool).ttft_s
            if cache == "on":
                modeled += model.pool_store_s(profile, n - local - pool)
            ttft = modeled * (1 + noise * rng.standard_normal())
            itl = model.itl_s(profile, n + OUTPUT_TOKENS // 2, 1)
            decode = (OUTPUT_TOKENS - 1) * itl * (1 + noise * rng.standard_normal())
            server = None
            if server_error_s is not None:
                server, ttft = ttft, ttft + server_error_s
            rows.append(
                    {
                        "run_id": run_id, "block": block, "block_in_placement": block,
                        "placement": "move-at:2", "cache": cache, "session_id": session,
                        "session_index": 0, "context_tokens": size, "turn": turn,
                        "replica": 0, "cross_replica": path == "pool", "warmup": False,
                        "status": "ok", "prompt_tokens": n, "local_hit_tokens": local,
                        "external_hit_tokens": pool, "hit_source": "counters",
                        "ttft_s": ttft, "e2e_s": ttft + decode,
                        "itl_p50_s": decode / (OUTPUT_TOKENS - 1),
                        "output_chunks": OUTPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                        "server_ttft_s": server,
                    }
                )  # fmt: skip
    return rows


def write_run(root: Path, rows: list[dict[str, Any]], run_id: str = "probe") -> Path:
    """A run folder of ``rows`` (a managed target at time scale 1)."""
    run = root / run_id
    run.mkdir(parents=True)
    atomic_write_parquet(run / "requests.parquet", rows_frame(rows, REQUEST_SCHEMA))
    manifest = {"schema_version": SCHEMA_VERSION, "run_id": run_id,
                "target": {"kind": "managed", "time_scale": 1.0}}  # fmt: skip
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def write_probe_run(root: Path, profile: SimProfile, *, noise: float, seed: int,
                    run_id: str = "probe", **kwargs: Any) -> Path:  # fmt: skip
    """A run folder of requests that ran alone, timed by the model (plus noise)."""
    rows = probe_rows(profile, noise=noise, seed=seed, run_id=run_id, **kwargs)
    return write_run(root, rows, run_id)


def truth(profile: SimProfile, knots: Sequence[int]) -> dict[str, float]:
    """The fit's parameters as ``profile`` has them, the overhead at the fit's knots."""
    out = {
        "request_overhead_s": 0.0,
        "prefill_s_per_ktok": profile.prefill_s_per_ktok,
        "attn_s_per_ktok2": profile.attn_s_per_ktok2,
        "pool_load_fixed_s": profile.pool_load_fixed_s,
        "pool_s_per_gb": 1.0 / profile.pool_bandwidth_gbps,
        "pool_bandwidth_gbps": profile.pool_bandwidth_gbps,
        "pool_store_s_per_gb": profile.pool_store_s_per_gb,
        "itl_base_s": profile.itl_base_s,
        "itl_per_ktok_s": profile.itl_per_ktok_s,
    }
    for k in knots[1:]:
        out[f"hit_overhead_{k}"] = model.hit_overhead_s(profile, k)
    return out
