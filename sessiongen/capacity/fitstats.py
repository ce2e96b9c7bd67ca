"""How far the requests stray from a fit: residuals, measurement error, service-time noise.

The noise's method is in :mod:`.fit`'s docstring (robust scale of cold requests'
deviations, a residual bootstrap for its interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.capacity import estimate
from sessiongen.capacity.estimate import Requests
from sessiongen.capacity.fitdata import stores
from sessiongen.capacity.fitted import CONFIDENCE, RESAMPLES

#: Cold requests at least this long measure the noise (shorter ones are mostly fixed costs).
NOISE_MIN_TOKENS = 2048
#: The median absolute deviation of a normal sample times this is its standard deviation.
MAD_TO_SD = 1.4826


def prefill_share(
    f: pl.DataFrame, values: dict[str, float], predicted: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Each request's modeled prefill of all its prompt over its modeled TTFT (for a cold
    request, the part of its time the noise scales), within [0.05, 1]."""
    k = f["n"].to_numpy() / 1000.0
    prefill = values["prefill_s_per_ktok"] * k + values["attn_s_per_ktok2"] * k * k
    modeled = np.maximum(np.asarray(predicted, dtype=np.float64), 1e-12)
    share: NDArray[np.float64] = np.clip(prefill / modeled, 0.05, 1.0)
    return share


@dataclass(frozen=True)
class Noise:
    """The service-time noise: its value, 95% interval and bootstrap draws."""

    value: float
    low: float
    high: float
    draws: NDArray[np.float64]  # one per resample, in resample order


def noise_sigma(
    f: pl.DataFrame,
    predicted: NDArray[np.float64],
    share: NDArray[np.float64],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Noise | None:
    """The service-time noise with its interval and draws (module docstring), None where
    no cell has two cold requests of :data:`NOISE_MIN_TOKENS` tokens or more.
    ``predicted``: each request's modeled TTFT; ``share``: its :func:`prefill_share`."""
    # log(measured / modeled): the model takes out what the prompt's length explains (a
    # cell's cold requests are its first turns and, pool off, its longer moved turns).
    modeled = np.maximum(np.asarray(predicted, dtype=np.float64), 1e-12)
    residual = np.log(f["ttft_s"].to_numpy()) - np.log(modeled)
    cold = f.with_columns(share=pl.Series(share), residual=pl.Series(residual)).filter(
        (pl.col("local") == 0) & (pl.col("pool") == 0) & (pl.col("n") >= NOISE_MIN_TOKENS)
    )
    cells = [
        (g["residual"].to_numpy(), g["share"].to_numpy())
        for _, g in cold.group_by("run", "context_tokens", "pool_on", maintain_order=True)
    ]
    cells = [(x, s) for x, s in cells if x.size >= 2]
    if not cells:
        return None
    # Each request's residual less its cell's mean, over its prefill share (the noise
    # scales the prefill; the rest of a cold request's time is fixed), scaled by
    # sqrt(n / (n - 1)) so that each has the noise's variance. Their scale is 1.4826 x
    # the median absolute deviation (a normal's standard deviation, robust to the few
    # requests a busy host stalls: beside a CPU hog the mean square gave 0.34 where a
    # quiet run gave 0.13). The interval resamples the deviations (a residual bootstrap:
    # resampling a cell of three requests itself would shrink its spread).
    deviations = np.abs(
        np.concatenate([(x - x.mean()) / s * math.sqrt(x.size / (x.size - 1)) for x, s in cells])
    )
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, deviations.size, (resamples, deviations.size))
    draws = MAD_TO_SD * np.median(deviations[picks], axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return Noise(MAD_TO_SD * float(np.median(deviations)), float(low), float(high), draws)


def _path() -> pl.Expr:
    return (
        pl.when(pl.col("pool") > 0)
        .then(pl.lit("pool"))
        .when(pl.col("local") > 0)
        .then(pl.lit("local"))
        .otherwise(pl.lit("cold"))
    )


def measurement_error(f: pl.DataFrame) -> pl.DataFrame:
    """Simulated runs: per (context size, path), the median of the client's TTFT minus
    the simulator's own and its share of the median TTFT (empty for real runs)."""
    rows = f.filter(pl.col("server_ttft_s").is_not_null())
    error = pl.col("ttft_s") - pl.col("server_ttft_s")
    return (
        rows.with_columns(path=_path())
        .group_by("context_tokens", "path")
        .agg(n=pl.len(), error_s=error.median(), ttft_s=pl.col("ttft_s").median())
        .with_columns(share=pl.col("error_s") / pl.col("ttft_s"))
        .sort("context_tokens", "path")
    )


def predict(f: pl.DataFrame, values: dict[str, float], knots: Sequence[int], kv: float) -> Any:
    """Modeled TTFT of each request under the fitted values (request overhead included)."""
    names = estimate.first_token_names(knots)
    coef = np.array([values.get(n, 0.0) for n in names])
    n, local, pool = (f[c].to_numpy().astype(np.float64) for c in ("n", "local", "pool"))
    zero, none = np.zeros_like(n), np.zeros(n.size, dtype=np.int64)
    r = Requests(n, local, pool, zero, zero, zero, none, none, none, stores(f))
    itl = values["itl_base_s"] + values["itl_per_ktok_s"] * n / 1000.0
    return estimate.first_token_design(r, knots, kv) @ coef + itl


def residuals(f: pl.DataFrame, predicted: Any) -> pl.DataFrame:
    """Per (context size, path): requests, median measured and modeled, median error."""
    return (
        f.with_columns(path=_path(), modeled_s=pl.Series(predicted))
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
