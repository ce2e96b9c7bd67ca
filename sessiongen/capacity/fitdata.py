"""What a fit stands on: the requests that ran alone, read from run folders, as arrays.

Also what the runs' manifests tell the fit: the model's KV size and the hardware line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.capacity.estimate import Requests
from sessiongen.capacity.fitted import FitError
from sessiongen.records.counters import local_hits
from sessiongen.records.meta import RunMeta
from sessiongen.records.run import load_run, one_in_flight
from sessiongen.scenario.models import RECIPES
from sessiongen.scenario.models import kv_bytes_per_token as recipe_kv_bytes_per_token

#: Most knots of the local-hit overhead (besides 0).
MOST_KNOTS = 6
#: The serving stack's distributions whose versions the profile's ``hardware`` names.
SERVERS = ("vllm", "lmcache")


@dataclass(frozen=True)
class Observation:
    """The requests a fit stands on: one row each, modeled seconds."""

    # n, local, pool, ttft_s, tpot_s, decode_ctx, server_ttft_s, context_tokens, run, unit
    frame: pl.DataFrame

    @property
    def n(self) -> int:
        return self.frame.height


def _alone(meta: RunMeta) -> pl.Expr:
    """Rows whose hits are exact and that ran alone: counted from the replicas'
    counters at concurrency 1 (null: older runs' counter deltas), or the planner's own
    account with one closed-loop session in flight."""
    counted = pl.col("hit_source").is_null() | (pl.col("hit_source") == "counters")
    return counted | ((pl.col("hit_source") == "planner") & one_in_flight(meta))


def observations(run_dirs: Sequence[str | Path]) -> Observation:
    """Requests that ran alone, with exact hits, from every run."""
    frames = []
    for index, run_dir in enumerate(run_dirs):
        run = load_run(run_dir)
        rows = run.ok.filter(
            pl.col("prompt_tokens").is_not_null()
            & pl.col("local_hit_tokens").is_not_null()
            & pl.col("external_hit_tokens").is_not_null()
            & _alone(run.meta)
        )
        tokens = pl.coalesce("completion_tokens", "output_chunks").cast(pl.Float64)
        gaps = (pl.col("e2e_s") - pl.col("ttft_s")) / (tokens - 1)
        frames.append(
            rows.select(
                pl.col("prompt_tokens").cast(pl.Float64).alias("n"),
                _mended_local().cast(pl.Float64).alias("local"),
                pl.col("external_hit_tokens").cast(pl.Float64).alias("pool"),
                "ttft_s",
                pl.when(tokens >= 3).then(gaps).otherwise(None).alias("tpot_s"),
                (pl.col("prompt_tokens") + tokens / 2).alias("decode_ctx"),
                "server_ttft_s",
                "context_tokens",
                (pl.col("cache") == "on").cast(pl.Float64).alias("pool_on"),
                pl.lit(index).alias("run"),
                pl.concat_str(pl.lit(run.run_id), pl.col("block"), pl.col("session_id")).alias(
                    "unit"
                ),
            )
        )
    if not frames or sum(f.height for f in frames) == 0:
        raise FitError("no requests that ran alone with exact hit counts (concurrency 1)")
    return Observation(pl.concat(frames))


def check_observations(obs: Observation) -> None:
    """Refuse, with one line, when a parameter has nothing to stand on."""
    f = obs.frame
    cold = f.filter((pl.col("local") == 0) & (pl.col("pool") == 0))
    if cold["n"].n_unique() < 2:
        raise FitError(
            "prefill: needs cold requests (nothing cached) at two or more prompt sizes; "
            "run the probe scenario (scenarios/fitprobe.toml)"
        )
    if f.filter(pl.col("local") > 0).is_empty():
        raise FitError("local-hit overhead: needs requests that hit the replica's own cache")
    if f.filter(pl.col("pool") > 0).is_empty():
        raise FitError(
            "pool load cost and bandwidth: no cross-replica turns with the pool on "
            "(external hits); run the probe scenario with design.cache = [off, on]"
        )
    if f.filter(pl.col("tpot_s").is_not_null()).is_empty():
        raise FitError("decode step: needs requests with at least 3 output tokens")


def choose_knots(local_hits: NDArray[np.float64], most: int = MOST_KNOTS) -> tuple[int, ...]:
    """0 and up to ``most`` knots: the local-hit sizes, grouped to the nearest 1k tokens,
    each knot at its group's largest hit. A knot on the data, and none of the data past
    the last knot (the overhead is flat there), so the value at a knot is the overhead
    measured at that size."""
    groups: dict[int, int] = {}
    for x in local_hits:
        if x > 0:
            key = round(float(x) / 1000.0)
            groups[key] = max(groups.get(key, 0), int(x))
    sizes = sorted(groups.values())
    if len(sizes) > most:
        picks = np.linspace(0, len(sizes) - 1, most).round().astype(int)
        sizes = [sizes[i] for i in sorted(set(picks.tolist()))]
    return (0, *sizes)


def as_requests(f: pl.DataFrame) -> Requests:
    """The frame's rows as arrays, with their session and (run, context size, cache arm)
    stratum (the arms' sessions have different turns: a resample keeps both designs)."""
    unit_ids = f["unit"].unique(maintain_order=True).to_list()
    index = {u: i for i, u in enumerate(unit_ids)}
    session = np.array([index[u] for u in f["unit"].to_list()], dtype=np.int64)
    first = f.group_by("unit", maintain_order=True).agg(
        pl.col("run").first(), pl.col("context_tokens").first(), pl.col("pool_on").first()
    )
    strata = {row[0]: (row[1], row[2], row[3]) for row in first.iter_rows()}
    keys = sorted(set(strata.values()))
    stratum_of = {u: keys.index(k) for u, k in strata.items()}
    return Requests(
        n=f["n"].to_numpy().astype(np.float64),
        local=f["local"].to_numpy().astype(np.float64),
        pool=f["pool"].to_numpy().astype(np.float64),
        ttft=f["ttft_s"].to_numpy().astype(np.float64),
        tpot=f["tpot_s"].fill_null(np.nan).to_numpy().astype(np.float64),
        decode_ctx=f["decode_ctx"].fill_null(0).to_numpy().astype(np.float64),
        session=session,
        stratum=np.array([stratum_of[u] for u in unit_ids], dtype=np.int64)[session],
        run=f["run"].to_numpy().astype(np.int64),
        store=stores(f),
    )


def stores(f: pl.DataFrame) -> NDArray[np.float64]:
    """1 for requests of the pool-on arm, when the runs hold both arms (else all 0)."""
    on = f["pool_on"].to_numpy().astype(np.float64)
    return on if 0.0 < on.mean() < 1.0 else np.zeros_like(on)


def hardware(metas: Sequence[RunMeta]) -> str:
    """What the runs ran on, one line: the client host's facts (CPU model where the
    manifest has it, cores, architecture, platform, GPUs), the target's kind and device, the
    serving stack's versions; runs that differ are joined with `` | ``."""
    lines: list[str] = []
    for meta in metas:
        host = meta.raw.get("host") or {}
        cpu = host.get("cpu_model") or host.get("processor")
        facts = [str(cpu)] if cpu else []
        if host.get("cpu_count"):
            facts.append(f"{host['cpu_count']} cores")
        facts += [str(host[k]) for k in ("machine", "platform") if host.get(k)]
        facts += [f"GPU {gpu}" for gpu in host.get("gpus") or ()]
        target = f"target {meta.target_kind}"
        device = (meta.target.get("spec") or {}).get("device")
        if device:
            target += f" on {device}"
        parts = [f"host {', '.join(facts) or 'not recorded'}", target]
        versions = _stack_versions(meta.target)
        if versions:
            parts.append(", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
        line = "; ".join(parts)
        if line not in lines:
            lines.append(line)
    return " | ".join(lines)


def _stack_versions(node: Any) -> dict[str, str]:
    """vLLM's and LMCache's versions wherever the target's facts hold them: a managed
    block's processes (``versions`` by distribution) or a server's ``/version``."""
    out: dict[str, str] = {}
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "versions" and isinstance(value, Mapping):
                out.update({str(k): str(v) for k, v in value.items() if str(k).startswith(SERVERS)})
            elif key == "version" and isinstance(value, Mapping) and "version" in value:
                out.setdefault("vllm", str(value["version"]))
            elif key == "version" and isinstance(value, str):
                out.setdefault("vllm", value)
            else:
                out.update(_stack_versions(value))
    elif isinstance(node, list):
        for value in node:
            out.update(_stack_versions(value))
    return out


def kv_bytes_from(meta: RunMeta) -> int | None:
    """KV bytes per token of the run's model, where the manifest tells it."""
    profile = meta.target.get("profile") or {}
    if "kv_bytes_per_token" in profile:
        return int(profile["kv_bytes_per_token"])
    spec = meta.target.get("spec") or {}
    recipe = RECIPES.get(str(spec.get("model")))
    return None if recipe is None else recipe_kv_bytes_per_token(recipe)


def _mended_local() -> pl.Expr:
    """``local_hit_tokens`` as :func:`~sessiongen.records.counters.local_hits` mends it:
    records written before the replay applied it keep the counter's over-count."""
    return pl.struct("local_hit_tokens", "external_hit_tokens", "cached_tokens").map_elements(
        lambda r: local_hits(r["local_hit_tokens"], r["external_hit_tokens"], r["cached_tokens"]),
        return_dtype=pl.Int64,
    )
