"""Fit the simulator's timing profile to real runs: ``sessiongen fit RUN_DIR... -o P.toml``.

The simulator models one request's time to first token, when nothing queues, as
(:mod:`sessiongen.sim.model`)::

    TTFT = H(local) + a u + b ((n^2 - h^2)) + [pool > 0] (c0 + pool * kv / BW)
           + [pool on] s u kv + ITL(n)

in thousands of tokens for ``n`` (prompt), ``u`` (recomputed), ``h`` (hit = local +
pool), with ``H`` the local-hit overhead (piecewise linear over the locally hit
tokens, 0 without a local hit), ``c0`` the fixed cost of a pool load and ``BW`` the
pool-to-GPU bandwidth for ``kv`` bytes per token, ``s`` the cost of storing computed KV
in the pool (``pool_store_s_per_gb``: paid only by requests of the pool-on arm, so it
is told apart from the prefill cost only when the runs hold both arms' requests; with
one arm it is held at 0 and reported not identified, its cost inside ``a``), and
``ITL(n) = itl_base + itl_k n`` the decode step at batch 1. A measured TTFT also holds
time no engine step accounts for: the client, HTTP, the server's tokenization (and,
in a simulated run, the client's and the simulator's lateness divided by the time
scale). The fit gives it a
term of its own, the *request overhead* ``c`` paid by every request, fitted with
either sign; without it the constant lands in the prefill cost (cold requests have
no other constant) and in ``H`` and ``c0``, and their intervals miss the truth.

Everything is linear in the parameters once ``H`` is written as values at knots (the
distinct local-hit sizes), so the fit is (numerics and their sources in
:mod:`.estimate`):

1. decode: each request's mean decode gap against its decode context gives
   ``itl_base`` and ``itl_per_ktok_s``;
2. first token: ``TTFT - ITL(n)`` against the columns above gives ``c``, ``a``, ``b``,
   ``c0``, ``kv / BW`` and the overhead at the knots, by least squares weighted by the
   predicted TTFT (relative errors), iterated until the weights settle.

Only requests that ran alone are used (exact hit attribution: ``hit_source`` counters,
older runs' counter deltas, or the planner's own account at one session in flight), so
no queueing is in their times. Intervals are percentile bootstrap intervals over
sessions, stratified by run, context size and cache arm (rescaled for the few sessions each
size has), runs resampled too when several are given, 2,000 resamples, seeded; failed
resamples are counted. Parameters the runs
cannot determine are reported as *not identified by these runs*, with the design's
rank and condition number. The fit refuses, with one line, when the runs lack what a
parameter needs: cold requests at two or more sizes (prefill), local hits (their
overhead), pool hits on cross-replica turns with the pool on (load cost and
bandwidth), decode gaps (ITL). Residuals are reported per (context size, path) cell:
cold, local, pool. For a simulated run the client's TTFT is compared with the
simulator's own, and a measurement error beyond :data:`ERROR_SHARE` of a cell's TTFT
is a warning: the fitted values carry it.

The simulator has no per-request term, so the profile written adds ``c`` to the
local-hit overhead at each knot and to the pool's fixed cost: the simulator then
reproduces the measured local and pool TTFTs, and models cold ones short by ``c``.

The *service-time noise* (``prefill_noise_sigma``, :mod:`sessiongen.sim.noise`) is the
spread of cold requests of at least :data:`NOISE_MIN_TOKENS` tokens (where the prefill
is most of the time) around the fit: log(measured / modeled TTFT) less its (run, context
size, arm) cell's mean, divided by the modeled prefill's share of the TTFT, its scale
1.4826 x the median absolute deviation (robust to stalled requests). Its interval:
percentile bootstrap of those deviations (requests). The fitted costs are the
mean behaviour; the noise is how far one request strays from it, which decides, with
sessions in flight together, who queues behind whose long prefill.

The profile file (:func:`profile_toml`) carries, beside ``[target.sim]``, what it stands
on: ``[fit]`` (provenance), ``[fit.interval]`` (each identified key's interval),
``[[fit.draw]]`` (joint draws of every fitted parameter, :meth:`Fit.draws`, for the
planner's replicates) and, with held-out runs (``--heldout``, :mod:`.modelerror`),
``[fit.model_error]``: the model's own error per regime.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from sessiongen.analysis import structure
from sessiongen.analysis.fidelity import ERROR_SHARE
from sessiongen.capacity import estimate
from sessiongen.capacity.estimate import (
    DECODE_PARAMS,
    FIRST_TOKEN_PARAMS,
    OVERHEAD,
    Requests,
)
from sessiongen.capacity.fitdata import (
    as_requests,
    check_observations,
    choose_knots,
    hardware,
    kv_bytes_from,
    observations,
)
from sessiongen.capacity.fitprofile import profile_toml, summary_text, write_profile
from sessiongen.capacity.fitstats import (
    MAD_TO_SD,
    NOISE_MIN_TOKENS,
    measurement_error,
    noise_sigma,
    predict,
    prefill_share,
    residuals,
)
from sessiongen.capacity.fitted import (
    CONFIDENCE,
    DRAWS_WRITTEN,
    NOISE,
    PROFILE_INTERVAL_KEYS,
    RESAMPLES,
    STORE,
    Design,
    Fit,
    FitError,
    bandwidth,
)
from sessiongen.records.io import read_meta
from sessiongen.records.run import load_run

# The fit's front: what callers (the CLI, tests, benches, docs' figures) take from here;
# each name lives in the one-concept module it is imported from above.
__all__ = [
    "DRAWS_WRITTEN",
    "ERROR_SHARE",
    "FIRST_TOKEN_PARAMS",
    "MAD_TO_SD",
    "NOISE",
    "OVERHEAD",
    "PROFILE_INTERVAL_KEYS",
    "RESAMPLES",
    "STORE",
    "Fit",
    "FitError",
    "choose_knots",
    "fit",
    "fit_runs",
    "hardware",
    "observations",
    "predict",
    "profile_toml",
    "residuals",
    "summary_text",
    "with_loaded",
    "with_model_error",
    "write_profile",
]

#: A share of failed resamples above this is a warning (the intervals are then over the
#: resamples that could be fitted, not over all).
FAILED_SHARE = 0.01


def _ordered(values: dict[str, float], knots: Sequence[int]) -> dict[str, float]:
    names = [OVERHEAD, *FIRST_TOKEN_PARAMS, "pool_bandwidth_gbps"]
    names += [estimate.knot_name(k) for k in knots[1:]] + list(DECODE_PARAMS)
    return {k: values[k] for k in names}


def _identify(r: Requests, knots: Sequence[int], kv_bytes: float) -> Design:
    names = estimate.first_token_names(knots)
    first = estimate.identify(estimate.first_token_design(r, knots, kv_bytes), names)
    decode = estimate.identify(estimate.decode_design(r)[0], DECODE_PARAMS)
    return Design(first, decode)


def _not_identified(
    design: Design, values: dict[str, float], one_arm: str | None = None
) -> dict[str, str]:
    """Parameters the runs do not determine, and why (held ones say so); ``one_arm``:
    the cache arm every request ran in, when the runs hold only one."""
    out: dict[str, str] = {}
    for ident in (design.first_token, design.decode):
        for name, why in ident.unidentified.items():
            held = name in ident.held and "held at 0" not in why
            out[name] = why + ("; held at 0" if held else "")
    for name, v in values.items():
        if name != OVERHEAD and v == 0.0 and name not in out:
            out[name] = "at its bound 0"
    if "pool_s_per_gb" in out:
        out["pool_bandwidth_gbps"] = "from pool_s_per_gb, " + out["pool_s_per_gb"]
    if one_arm is not None:
        out[STORE] = (
            f"every request ran with the pool {one_arm}: a store cost is inside "
            "prefill_s_per_ktok; run both arms (design.cache = [off, on]); held at 0"
        )
    return out


def fit_runs(
    run_dirs: Sequence[str | Path],
    *,
    kv_bytes_per_token: int | None = None,
    resamples: int = RESAMPLES,
    seed: int = 0,
    progress: bool = False,
    heldout: Sequence[str | Path] = (),
) -> Fit:
    """:func:`fit` with the model's KV size and the pair's structure (KV block and
    cache, scheduler limits, pool chunk and size: :mod:`~sessiongen.analysis.structure`)
    taken from the
    first run's manifest where it tells them (``kv_bytes_per_token`` given wins), the
    loaded terms (:func:`with_loaded`) and, with ``heldout`` runs, the model's own error
    (:func:`with_model_error`)."""
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
    held = {Path(d).resolve() for d in heldout} & {Path(d).resolve() for d in run_dirs}
    if held:
        raise FitError(
            f"--heldout: {sorted(held)[0].name} is also a run to fit; a held-out run must "
            "not be one the fit stands on"
        )
    result = fit(run_dirs, kv_bytes_per_token=kv, fixed=fixed, resamples=resamples, seed=seed)
    result = with_loaded(result, run_dirs, seed=seed, progress=progress)
    return with_model_error(result, heldout)


def with_model_error(
    result: Fit, heldout: Sequence[str | Path], *, replicates: int | None = None
) -> Fit:
    """``result`` with the model's own error per regime (``[fit.model_error]``), from
    ``heldout`` replays (both cache arms) that the fit did not see, each planned with
    this fit's profile (:func:`.modelerror.heldout_model_error`); unchanged without."""
    from sessiongen.capacity import modelerror

    if not heldout:
        return result
    count = replicates or modelerror.HELDOUT_REPLICATES
    with tempfile.TemporaryDirectory() as tmp:
        profile = write_profile(result, Path(tmp) / "fitted.toml")
        table = modelerror.heldout_model_error(profile, heldout, replicates=count)
    names = tuple(str(Path(d)) for d in heldout)
    return dataclasses.replace(result, model_error=table, heldout=names)


def with_loaded(
    result: Fit, run_dirs: Sequence[str | Path], *, seed: int = 0, progress: bool = False
) -> Fit:
    """``result`` with the loaded terms fitted to the runs among ``run_dirs`` that had
    sessions in flight together (:mod:`.loaded`); unchanged when none had."""
    from sessiongen.capacity import loaded

    busy = [d for d in run_dirs if loaded.is_loaded(load_run(d))]
    if not busy:
        return result
    with tempfile.TemporaryDirectory() as tmp:
        profile = write_profile(result, Path(tmp) / "alone.toml")
        itl = result.values["itl_base_s"]
        terms = loaded.fit_loaded(busy, profile, itl, seed=seed, progress=progress)
    unknown = dict(result.not_identified)
    unknown.update(terms.not_identified)
    return dataclasses.replace(result, loaded=terms, not_identified=unknown)


def fit(
    run_dirs: Sequence[str | Path],
    *,
    kv_bytes_per_token: float,
    fixed: Mapping[str, float] | None = None,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Fit:
    """Fit the profile to the runs (see the module docstring)."""
    obs = observations(run_dirs)
    check_observations(obs)
    f = obs.frame
    knots = choose_knots(f["local"].to_numpy())
    r = as_requests(f)
    design = _identify(r, knots, kv_bytes_per_token)
    full = estimate.solve(r, knots, kv_bytes_per_token, held=design.held)
    values = dict(full.values)
    values["pool_bandwidth_gbps"] = bandwidth(values["pool_s_per_gb"])
    values = _ordered(values, knots)
    arms = f["pool_on"].unique().to_list()
    one_arm = None if len(arms) > 1 else ("on" if arms[0] == 1.0 else "off")
    unknown = _not_identified(design, values, one_arm)
    boot = estimate.bootstrap(
        r, knots, kv_bytes_per_token, full, held=design.held, resamples=resamples, seed=seed
    )
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for k, v in values.items():
        pair = (math.nan, math.nan)
        if k not in unknown:
            pair = boot.interval(k, v, CONFIDENCE, bounded=k != OVERHEAD)
        low[k], high[k] = pair
    # Bandwidth's interval is the inverse of the transfer cost's (monotone, so exact).
    if "pool_bandwidth_gbps" not in unknown:
        low["pool_bandwidth_gbps"] = bandwidth(high["pool_s_per_gb"])
        high["pool_bandwidth_gbps"] = bandwidth(low["pool_s_per_gb"])
    noise = noise_sigma(
        f, full.predicted, prefill_share(f, values, full.predicted), resamples=resamples, seed=seed
    )
    noise_draws: tuple[float, ...] = ()
    if noise is None:
        values[NOISE] = 0.0
        low[NOISE] = high[NOISE] = math.nan
        unknown[NOISE] = (
            f"fewer than two cold requests of {NOISE_MIN_TOKENS} tokens or more in a cell; "
            "the profile plans without noise"
        )
    else:
        values[NOISE], low[NOISE], high[NOISE] = noise.value, noise.low, noise.high
        noise_draws = tuple(noise.draws.tolist())
    res = residuals(f, full.predicted)
    fixed = {**(fixed or {}), "kv_bytes_per_token": int(kv_bytes_per_token)}
    sources = tuple(str(Path(d)) for d in run_dirs)
    warnings = _warnings(f, unknown, boot)
    return Fit(
        values, low, high, knots, res, obs.n, sources, fixed, unknown, design, boot, warnings,
        noise_draws=noise_draws, date=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        hardware=hardware([read_meta(Path(d)) for d in run_dirs]),
    )  # fmt: skip


def _warnings(
    f: pl.DataFrame, unknown: dict[str, str], boot: estimate.Resampling
) -> tuple[str, ...]:
    out = []
    if unknown:
        out.append(
            "warning: not identified by these runs (the profile holds what the least-squares "
            f"fit gave; the planner should not be asked about them): {', '.join(unknown)}"
        )
    if boot.fewest < 2:
        out.append(
            "warning: a context size has one session: nothing to resample there, so no "
            "intervals; run two or more sessions per size (sessions.count)"
        )
    if boot.failed > FAILED_SHARE * boot.resamples:
        out.append(
            f"warning: {boot.failed} of {boot.resamples} resamples could not be fitted; the "
            "intervals are over the others"
        )
    errors = measurement_error(f)
    flagged = errors.filter(pl.col("share").abs() > ERROR_SHARE)
    if not flagged.is_empty():
        worst = flagged.sort(pl.col("share").abs(), descending=True).row(0, named=True)
        out.append(
            f"warning: simulated run: the client's TTFT exceeds the simulator's own by more "
            f"than {ERROR_SHARE:.0%} in {flagged.height} of {errors.height} cells (worst "
            f"{worst['context_tokens']} {worst['path']}: {1000 * worst['error_s']:.3g} ms, "
            f"{worst['share']:+.0%}); the fitted values carry that measurement error (the "
            "client's and the simulator's lateness / time scale): raise target.sim.time_scale"
        )
    return tuple(out)
