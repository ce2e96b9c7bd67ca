"""Fit the simulator's timing profile to real runs: ``sessiongen fit RUN_DIR... -o P.toml``.

The simulator models one request's time to first token, when nothing queues, as
(:mod:`sessiongen.sim.model`)::

    TTFT = H(local) + a u + b ((n^2 - h^2)) + [pool > 0] (c0 + pool * kv / BW) + ITL(n)

in thousands of tokens for ``n`` (prompt), ``u`` (recomputed), ``h`` (hit = local +
pool), with ``H`` the local-hit overhead (piecewise linear over the locally hit
tokens, 0 without a local hit), ``c0`` the fixed cost of a pool load and ``BW`` the
pool-to-GPU bandwidth for ``kv`` bytes per token; ``ITL(n) = itl_base + itl_k n`` is
the decode step at batch 1. Everything is linear in the parameters once ``H`` is
written as values at knots, so the fit is two non-negative least-squares problems
(Lawson & Hanson 1974, ``scipy.optimize.nnls``):

1. decode: each request's median inter-token gap against its context gives
   ``itl_base`` and ``itl_per_ktok_s``;
2. first token: ``TTFT - ITL(n)`` against the columns above gives ``a``, ``b``, ``c0``,
   ``kv / BW`` and the overhead at the knots.

Only requests that ran alone are used (exact hit attribution: ``hit_source`` counters,
or older runs' counter deltas), so no queueing is in their times. Intervals are
percentile bootstrap intervals over sessions (Efron & Tibshirani 1993), 200 resamples,
seeded. The fit refuses, with one line, when the runs lack what a parameter needs: cold
requests at two or more sizes (prefill), local hits (their overhead), pool hits on
cross-replica turns with the pool on (load cost and bandwidth), decode gaps (ITL).
Residuals are reported per (context size, path) cell: cold, local, pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray
from scipy.optimize import nnls

from sessiongen.capacity import structure
from sessiongen.errors import UserError
from sessiongen.infra.files import atomic_write_bytes
from sessiongen.launch.tinymodel import BUILTIN_TINY
from sessiongen.launch.tinymodel import kv_bytes_per_token as tiny_kv_bytes_per_token
from sessiongen.records.format import RunMeta
from sessiongen.records.io import read_meta
from sessiongen.records.run import load_run

#: Parameters fitted, in the order of their design-matrix columns (after the knots).
FIRST_TOKEN_PARAMS = (
    "prefill_s_per_ktok",
    "attn_s_per_ktok2",
    "pool_load_fixed_s",
    "pool_s_per_gb",
)
RESAMPLES = 200


class FitError(UserError):
    """The runs do not contain what a parameter needs."""


@dataclass(frozen=True)
class Observation:
    """The requests a fit stands on: one row each, modeled seconds."""

    frame: pl.DataFrame  # prompt_tokens, local, pool, ttft_s, itl_p50_s, unit, context_tokens

    @property
    def n(self) -> int:
        return self.frame.height


@dataclass(frozen=True)
class Fit:
    """A fitted profile: values, intervals, residuals, and what it stood on."""

    values: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    knots: tuple[int, ...]
    residuals: pl.DataFrame
    requests: int
    sources: tuple[str, ...]
    fixed: dict[str, Any] = field(default_factory=dict)  # carried over, not fitted

    def profile(self) -> dict[str, Any]:
        """The ``[target.sim]`` parameters this fit gives."""
        v = self.values
        out: dict[str, Any] = dict(self.fixed)
        out.update(
            prefill_s_per_ktok=v["prefill_s_per_ktok"],
            attn_s_per_ktok2=v["attn_s_per_ktok2"],
            pool_load_fixed_s=v["pool_load_fixed_s"],
            pool_bandwidth_gbps=v["pool_bandwidth_gbps"],
            hit_overhead_tokens=list(self.knots),
            hit_overhead_s=[0.0, *(v[f"hit_overhead_{k}"] for k in self.knots[1:])],
            itl_base_s=v["itl_base_s"],
            itl_per_ktok_s=v["itl_per_ktok_s"],
        )
        return out


def observations(run_dirs: Sequence[str | Path]) -> Observation:
    """Requests that ran alone, with exact hits, from every run."""
    frames = []
    for run_dir in run_dirs:
        run = load_run(run_dir)
        rows = run.ok.filter(
            pl.col("prompt_tokens").is_not_null()
            & pl.col("local_hit_tokens").is_not_null()
            & pl.col("external_hit_tokens").is_not_null()
            & (pl.col("hit_source").is_null() | (pl.col("hit_source") == "counters"))
        )
        frames.append(
            rows.select(
                pl.col("prompt_tokens").cast(pl.Float64).alias("n"),
                pl.col("local_hit_tokens").cast(pl.Float64).alias("local"),
                pl.col("external_hit_tokens").cast(pl.Float64).alias("pool"),
                "ttft_s",
                "itl_p50_s",
                "output_chunks",
                "context_tokens",
                pl.concat_str(pl.lit(run.run_id), pl.col("block"), pl.col("session_id")).alias(
                    "unit"
                ),
            )
        )
    if not frames or sum(f.height for f in frames) == 0:
        raise FitError("no requests that ran alone with exact hit counts (concurrency 1)")
    return Observation(pl.concat(frames))


def _check(obs: Observation) -> None:
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
    if f.filter(pl.col("itl_p50_s").is_not_null() & (pl.col("output_chunks") >= 3)).is_empty():
        raise FitError("decode step: needs requests with at least 3 output tokens")


def choose_knots(local_hits: NDArray[np.float64], most: int = 4) -> tuple[int, ...]:
    """0 and up to ``most`` knots at the distinct local-hit sizes (rounded to 1k tokens)."""
    sizes = sorted({round(float(x) / 1000.0) * 1000 for x in local_hits if x > 0} - {0})
    if len(sizes) > most:
        picks = np.linspace(0, len(sizes) - 1, most).round().astype(int)
        sizes = [sizes[i] for i in sorted(set(picks.tolist()))]
    return (0, *sizes)


def _hat(x: NDArray[np.float64], knots: Sequence[int]) -> NDArray[np.float64]:
    """Interpolation weights of ``x`` on ``knots`` (flat beyond the last), knot 0 dropped:
    ``H(x) = weights @ values`` reproduces ``numpy.interp`` on the knots."""
    out = np.zeros((x.size, len(knots) - 1))
    for j in range(1, len(knots)):
        basis = np.zeros(len(knots))
        basis[j] = 1.0
        out[:, j - 1] = np.interp(x, knots, basis)
    out[x <= 0] = 0.0  # no local hit: no overhead
    return out


def _fit_itl(f: pl.DataFrame) -> tuple[float, float]:
    rows = f.filter(pl.col("itl_p50_s").is_not_null() & (pl.col("output_chunks") >= 3))
    ctx = rows["n"].to_numpy() / 1000.0
    design = np.column_stack([np.ones_like(ctx), ctx])
    coef, _ = nnls(design, rows["itl_p50_s"].to_numpy())
    return float(coef[0]), float(coef[1])


def _design(f: pl.DataFrame, knots: Sequence[int], kv_bytes: float) -> NDArray[np.float64]:
    n, local, pool = (f[c].to_numpy() for c in ("n", "local", "pool"))
    hit = local + pool
    u = (n - hit) / 1000.0
    attn = (n / 1000.0) ** 2 - (hit / 1000.0) ** 2
    pool_on = (pool > 0).astype(np.float64)
    pool_gb = pool * kv_bytes / 1e9
    return np.column_stack([u, attn, pool_on, pool_gb, _hat(local, knots)])


def _solve(f: pl.DataFrame, knots: Sequence[int], kv_bytes: float) -> dict[str, float]:
    base, per_k = _fit_itl(f)
    ttft = f["ttft_s"].to_numpy()
    y = ttft - (base + per_k * f["n"].to_numpy() / 1000.0)
    # Relative errors: a 50 ms local hit weighs as much as a 30 s cold prefill.
    w = 1.0 / np.maximum(ttft, 1e-6)
    coef, _ = nnls(_design(f, knots, kv_bytes) * w[:, None], np.maximum(y, 0.0) * w)
    values = dict(zip(FIRST_TOKEN_PARAMS, coef[:4].tolist(), strict=True))
    values["pool_bandwidth_gbps"] = _bandwidth(values["pool_s_per_gb"])
    for k, v in zip(knots[1:], coef[4:].tolist(), strict=True):
        values[f"hit_overhead_{k}"] = v
    values.update(itl_base_s=base, itl_per_ktok_s=per_k)
    return values


#: Bandwidth reported when the transfer term is too small to measure (GB/s).
UNMEASURABLE_GBPS = 1e6


def _bandwidth(s_per_gb: float) -> float:
    """GB/s from seconds per GB (capped where the runs could not see a transfer cost)."""
    return min(UNMEASURABLE_GBPS, 1.0 / s_per_gb) if s_per_gb > 0 else UNMEASURABLE_GBPS


def predict(f: pl.DataFrame, values: dict[str, float], knots: Sequence[int], kv: float) -> Any:
    """Modeled TTFT of each request under the fitted values."""
    coef = np.array(
        [values[p] for p in FIRST_TOKEN_PARAMS] + [values[f"hit_overhead_{k}"] for k in knots[1:]]
    )
    itl = values["itl_base_s"] + values["itl_per_ktok_s"] * f["n"].to_numpy() / 1000.0
    return _design(f, knots, kv) @ coef + itl


def residuals(f: pl.DataFrame, predicted: Any) -> pl.DataFrame:
    """Per (context size, path): requests, median measured and modeled, median error."""
    path = (
        pl.when(pl.col("pool") > 0)
        .then(pl.lit("pool"))
        .when(pl.col("local") > 0)
        .then(pl.lit("local"))
        .otherwise(pl.lit("cold"))
    )
    return (
        f.with_columns(path=path, modeled_s=pl.Series(predicted))
        .with_columns(error=(pl.col("modeled_s") - pl.col("ttft_s")) / pl.col("ttft_s"))
        .group_by("context_tokens", "path")
        .agg(
            n=pl.len(),
            measured_s=pl.col("ttft_s").median(),
            modeled_s=pl.col("modeled_s").median(),
            median_error=pl.col("error").median(),
        )
        .sort("context_tokens", "path")
    )


def fit_runs(
    run_dirs: Sequence[str | Path], *, kv_bytes_per_token: int | None = None, seed: int = 0
) -> Fit:
    """:func:`fit` with the model's KV size and the pair's structure (KV block and
    cache, scheduler limits, pool chunk and size: :mod:`.structure`) taken from the
    first run's manifest where it tells them (``kv_bytes_per_token`` given wins)."""
    if not run_dirs:
        raise FitError("no run folders given")
    meta = read_meta(Path(run_dirs[0]))
    kv = kv_bytes_per_token or kv_bytes_from(meta)
    if kv is None:
        raise FitError(
            f"{run_dirs[0]}: the model's KV bytes per token are unknown; give "
            "--kv-bytes-per-token (2 x layers x KV heads x head dim x dtype bytes)"
        )
    fixed = structure.structure(meta, kv_bytes_per_token=kv)
    return fit(run_dirs, kv_bytes_per_token=kv, fixed=fixed, seed=seed)


def fit(
    run_dirs: Sequence[str | Path],
    *,
    kv_bytes_per_token: float,
    fixed: dict[str, Any] | None = None,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Fit:
    """Fit the profile to the runs (see the module docstring)."""
    obs = observations(run_dirs)
    _check(obs)
    f = obs.frame
    knots = choose_knots(f["local"].to_numpy())
    values = _solve(f, knots, kv_bytes_per_token)
    units = f["unit"].unique().sort().to_list()
    groups = {u: sub for (u,), sub in f.partition_by("unit", as_dict=True).items()}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {k: [] for k in values}
    for _ in range(resamples):
        picked = rng.integers(0, len(units), len(units))
        sample = pl.concat([groups[units[i]] for i in picked])
        try:
            for k, v in _solve(sample, knots, kv_bytes_per_token).items():
                draws[k].append(v)
        except (ValueError, np.linalg.LinAlgError):
            continue
    low = {k: float(np.quantile(v, 0.025)) if v else math.nan for k, v in draws.items()}
    high = {k: float(np.quantile(v, 0.975)) if v else math.nan for k, v in draws.items()}
    # Bandwidth's interval is the inverse of the transfer cost's (monotone, so exact).
    low["pool_bandwidth_gbps"] = _bandwidth(high["pool_s_per_gb"])
    high["pool_bandwidth_gbps"] = _bandwidth(low["pool_s_per_gb"])
    res = residuals(f, predict(f, values, knots, kv_bytes_per_token))
    fixed = {**(fixed or {}), "kv_bytes_per_token": int(kv_bytes_per_token)}
    sources = tuple(str(Path(d)) for d in run_dirs)
    return Fit(values, low, high, knots, res, obs.n, sources, fixed)


def kv_bytes_from(meta: RunMeta) -> int | None:
    """KV bytes per token of the run's model, where the manifest tells it."""
    profile = meta.target.get("profile") or {}
    if "kv_bytes_per_token" in profile:
        return int(profile["kv_bytes_per_token"])
    spec = meta.target.get("spec") or {}
    if spec.get("model") == BUILTIN_TINY:
        return tiny_kv_bytes_per_token()
    return None


def profile_toml(result: Fit) -> str:
    """The fitted profile as a TOML file with its provenance in comments."""
    lines = [
        "# sessiongen simulator profile fitted by `sessiongen fit` (load it with",
        "# --set target.sim.profile=THIS_FILE). 95% bootstrap intervals over sessions:",
    ]
    for k, v in result.values.items():
        lines.append(f"#   {k} = {v:.6g}  [{result.low[k]:.6g}, {result.high[k]:.6g}]")
    runs = ", ".join(Path(d).name for d in result.sources)  # run ids: no machine's paths
    lines.append(f"# from {result.requests} requests of runs: {runs}")
    lines += [f"# {line}" for line in _residual_lines(result)]
    missing = structure.unknown(result.fixed)
    if missing:
        lines.append(f"# not told by the runs (set them for your pair): {', '.join(missing)}")
    lines.append("")
    lines.append("[target.sim]")
    for k, v in result.profile().items():
        lines.append(f"{k} = {_toml(v)}")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def summary_text(result: Fit) -> str:
    """The fitted values with intervals, then the residuals per cell, as plain text."""
    lines = [f"fitted on {result.requests} requests that ran alone:"]
    for k, v in result.values.items():
        lines.append(f"  {k:<24} {v:12.6g}  [{result.low[k]:.6g}, {result.high[k]:.6g}]")
    return "\n".join(lines + _residual_lines(result))


def _residual_lines(result: Fit) -> list[str]:
    lines = ["residuals (modeled / measured - 1, median per cell):"]
    for r in result.residuals.iter_rows(named=True):
        lines.append(
            f"  {r['context_tokens']:>8} {r['path']:<6} n={r['n']:<4} measured "
            f"{r['measured_s']:.4g} s, modeled {r['modeled_s']:.4g} s, {r['median_error']:+.1%}"
        )
    return lines


def write_profile(result: Fit, path: Path) -> Path:
    """Write the fitted profile atomically."""
    atomic_write_bytes(path, profile_toml(result).encode())
    return path
