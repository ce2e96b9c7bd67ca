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
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis import structure
from sessiongen.analysis.fidelity import ERROR_SHARE
from sessiongen.capacity import estimate
from sessiongen.capacity.estimate import (
    DECODE_PARAMS,
    FIRST_TOKEN_PARAMS,
    OVERHEAD,
    Identification,
    Requests,
)
from sessiongen.capacity.loaded import LoadedFit
from sessiongen.errors import UserError
from sessiongen.infra.files import atomic_write_bytes
from sessiongen.launch.tinymodel import BUILTIN_TINY
from sessiongen.launch.tinymodel import kv_bytes_per_token as tiny_kv_bytes_per_token
from sessiongen.records.format import RunMeta
from sessiongen.records.io import read_meta
from sessiongen.records.run import load_run

__all__ = [
    "ERROR_SHARE",
    "FIRST_TOKEN_PARAMS",
    "OVERHEAD",
    "RESAMPLES",
    "Fit",
    "FitError",
    "choose_knots",
    "fit",
    "fit_runs",
    "observations",
    "predict",
    "profile_toml",
    "residuals",
    "summary_text",
    "write_profile",
]

RESAMPLES = 2000
STORE = "pool_store_s_per_gb"
NOISE = "prefill_noise_sigma"
#: Cold requests at least this long measure the noise (shorter ones are mostly fixed costs).
NOISE_MIN_TOKENS = 2048
#: The median absolute deviation of a normal sample times this is its standard deviation.
MAD_TO_SD = 1.4826
#: Joint parameter draws written to the profile file for the planner (``[[fit.draw]]``):
#: ``sessiongen plan --seeds N`` gives replicate k >= 1 draw k - 1 and refuses N above
#: the draws + 1 (no draw used twice), so 100 allow --seeds up to 101, ten times the held-out
#: bench's 10. Size, measured: a draw is 0.49 kB of TOML (four overhead knots, no loaded
#: terms), so a profile of the synthetic probe run is 53 kB, 49 kB of it the draws;
#: `sessiongen fit` takes at least 1,000 resamples (--resamples), so they are there.
DRAWS_WRITTEN = 100
CONFIDENCE = 0.95
#: Most knots of the local-hit overhead (besides 0).
MOST_KNOTS = 6
#: Bandwidth written when the transfer term is held at 0 or too small to measure (GB/s).
UNMEASURABLE_GBPS = 1e6
#: A share of failed resamples above this is a warning (the intervals are then over the
#: resamples that could be fitted, not over all).
FAILED_SHARE = 0.01


#: The serving stack's distributions whose versions the profile's ``hardware`` names.
SERVERS = ("vllm", "lmcache")
#: ``[target.sim]`` keys whose fitted intervals the profile writes (``[fit.interval]``).
PROFILE_INTERVAL_KEYS = (
    "prefill_s_per_ktok",
    "attn_s_per_ktok2",
    "pool_load_fixed_s",
    "pool_bandwidth_gbps",
    STORE,
    "itl_base_s",
    "itl_per_ktok_s",
)


class FitError(UserError):
    """The runs do not contain what a parameter needs."""


@dataclass(frozen=True)
class Observation:
    """The requests a fit stands on: one row each, modeled seconds."""

    # n, local, pool, ttft_s, tpot_s, decode_ctx, server_ttft_s, context_tokens, run, unit
    frame: pl.DataFrame

    @property
    def n(self) -> int:
        return self.frame.height


@dataclass(frozen=True)
class Design:
    """What the runs determine: the first-token and decode designs' identification."""

    first_token: Identification
    decode: Identification

    @property
    def held(self) -> tuple[str, ...]:
        return self.first_token.held + self.decode.held


@dataclass(frozen=True)
class Fit:
    """A fitted profile: values, intervals, residuals, and what it stood on.

    ``low`` and ``high`` are NaN for a parameter in ``not_identified`` (name -> why).
    """

    values: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    knots: tuple[int, ...]
    residuals: pl.DataFrame
    requests: int
    sources: tuple[str, ...]
    fixed: dict[str, float] = field(default_factory=dict)  # carried over, not fitted
    not_identified: dict[str, str] = field(default_factory=dict)
    design: Design | None = None
    resampling: estimate.Resampling | None = None
    warnings: tuple[str, ...] = ()
    loaded: LoadedFit | None = None  # the loaded terms, when loaded runs were given
    noise_draws: tuple[float, ...] = ()  # the noise's resamples (:func:`noise_sigma`)
    date: str = ""  # when the fit ran, UTC, ISO 8601
    hardware: str = ""  # what the runs ran on (:func:`hardware`)
    # the model's own error per regime from held-out runs (:func:`with_model_error`)
    model_error: dict[str, float | str] | None = None  # sigmas, cells_*, source
    heldout: tuple[str, ...] = ()  # the held-out runs' folders

    def profile(
        self, values: dict[str, float] | None = None, loaded: Mapping[str, object] | None = None
    ) -> dict[str, object]:
        """The ``[target.sim]`` parameters this fit gives (the request overhead added
        to the local-hit overhead and the pool's fixed cost: the simulator has no term
        for it); of ``values`` and ``loaded`` (one draw's) instead of the fit's when given."""
        v = self.values if values is None else values
        c = v.get(OVERHEAD, 0.0)
        out: dict[str, object] = dict(self.fixed) if values is None else {}
        out.update(
            prefill_s_per_ktok=v["prefill_s_per_ktok"],
            attn_s_per_ktok2=v["attn_s_per_ktok2"],
            pool_load_fixed_s=max(0.0, v["pool_load_fixed_s"] + c),
            pool_bandwidth_gbps=v["pool_bandwidth_gbps"],
            pool_store_s_per_gb=v.get(STORE, 0.0),
            hit_overhead_tokens=list(self.knots),
            hit_overhead_s=[0.0, *(max(0.0, v[estimate.knot_name(k)] + c) for k in self.knots[1:])],
            itl_base_s=v["itl_base_s"],
            itl_per_ktok_s=v["itl_per_ktok_s"],
            prefill_noise_sigma=v.get(NOISE, 0.0),
        )
        if self.loaded is not None:
            out.update(self.loaded.profile() if loaded is None else loaded)
        return out

    def draws(self, most: int = DRAWS_WRITTEN) -> list[dict[str, object]]:
        """Up to ``most`` joint draws of every fitted parameter, as profiles (:meth:`profile`
        of each). Draw ``i`` takes resample ``i`` of each of the fit's three bootstraps:
        the first-token and decode costs (sessions, :func:`.estimate.bootstrap`), the
        service-time noise (its deviations, :func:`noise_sigma`) and the loaded terms
        (each resample's best candidate, :mod:`.loaded`). Parameters the runs do not
        identify keep their fitted value. The three resample different things (sessions
        alone, requests' deviations, loaded sessions), so they are paired by index, not
        by a shared resample: each draw varies all, their covariances across the three
        are not in it."""
        boot = self.resampling
        if boot is None or not boot.draws:
            return []
        count = min(len(d) for d in boot.draws.values())
        noisy = NOISE not in self.not_identified and self.noise_draws
        if noisy:
            count = min(count, len(self.noise_draws))
        if self.loaded is not None and self.loaded.choices:
            count = min(count, len(self.loaded.choices))
        out = []
        for i in range(min(most, count)):
            values = dict(self.values)
            for k, d in boot.draws.items():
                if k not in self.not_identified:
                    values[k] = float(d[i])
            values["pool_bandwidth_gbps"] = _bandwidth(values["pool_s_per_gb"])
            if noisy:
                values[NOISE] = self.noise_draws[i]
            terms = None
            if self.loaded is not None and self.loaded.choices:
                terms = self.loaded.draw(i)
            out.append(self.profile(values, terms))
        return out

    def intervals(self) -> dict[str, tuple[float, float]]:
        """Each identified ``[target.sim]`` key's 95% interval as the profile holds it
        (the local-hit overhead's knots left out). The pool's fixed cost there includes
        the request overhead, so its interval is that sum's, from the same resamples."""
        out: dict[str, tuple[float, float]] = {}
        for key in (*PROFILE_INTERVAL_KEYS, NOISE):
            if key in self.values and key not in self.not_identified:
                out[key] = (self.low[key], self.high[key])
        fixed = "pool_load_fixed_s"
        boot = self.resampling
        if fixed in out and OVERHEAD not in self.not_identified and boot is not None:
            both = boot.draws[fixed] + boot.draws[OVERHEAD]
            summed = dataclasses.replace(boot, draws={fixed: both})
            estimate_ = self.values[fixed] + self.values[OVERHEAD]
            out[fixed] = summed.interval(fixed, estimate_, CONFIDENCE, bounded=True)
        terms = self.loaded
        if terms is not None and "itl_per_batch_s" not in self.not_identified:
            out["itl_per_batch_s"] = (terms.batch_low, terms.batch_high)
        return {k: (float(lo), float(hi)) for k, (lo, hi) in out.items() if math.isfinite(lo + hi)}

    def interval_text(self, name: str) -> str:
        """``[low, high]``, or why the runs do not tell the parameter."""
        if name in self.not_identified:
            return f"not identified by these runs ({self.not_identified[name]})"
        if math.isnan(self.low[name]):
            return "no interval (a context size with one session)"
        return f"[{self.low[name]:.6g}, {self.high[name]:.6g}]"


def _alone(meta: RunMeta) -> pl.Expr:
    """Rows whose hits are exact and that ran alone: counted from the replicas'
    counters at concurrency 1 (null: older runs' counter deltas), or the planner's own
    account with one closed-loop session in flight."""
    counted = pl.col("hit_source").is_null() | (pl.col("hit_source") == "counters")
    load = meta.scenario.get("load") or {}
    driver = meta.scenario.get("driver") or {}
    closed = load.get("arrival", "closed") == "closed"
    one = pl.col("load_level") == 1 if closed else pl.lit(False)
    if closed and driver.get("concurrency") == 1:
        one = one | pl.col("load_level").is_null()
    return counted | ((pl.col("hit_source") == "planner") & one)


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
                pl.col("local_hit_tokens").cast(pl.Float64).alias("local"),
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


def _requests(f: pl.DataFrame) -> Requests:
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
        store=_stores(f),
    )


def _stores(f: pl.DataFrame) -> NDArray[np.float64]:
    """1 for requests of the pool-on arm, when the runs hold both arms (else all 0)."""
    on = f["pool_on"].to_numpy().astype(np.float64)
    return on if 0.0 < on.mean() < 1.0 else np.zeros_like(on)


def _bandwidth(s_per_gb: float) -> float:
    """GB/s from seconds per GB (capped where the runs could not see a transfer cost)."""
    if math.isnan(s_per_gb):
        return math.nan
    return min(UNMEASURABLE_GBPS, 1.0 / s_per_gb) if s_per_gb > 0 else UNMEASURABLE_GBPS


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
    _check(obs)
    f = obs.frame
    knots = choose_knots(f["local"].to_numpy())
    r = _requests(f)
    design = _identify(r, knots, kv_bytes_per_token)
    full = estimate.solve(r, knots, kv_bytes_per_token, held=design.held)
    values = dict(full.values)
    values["pool_bandwidth_gbps"] = _bandwidth(values["pool_s_per_gb"])
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
        low["pool_bandwidth_gbps"] = _bandwidth(high["pool_s_per_gb"])
        high["pool_bandwidth_gbps"] = _bandwidth(low["pool_s_per_gb"])
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


def hardware(metas: Sequence[RunMeta]) -> str:
    """What the runs ran on, one line: the client host's facts (CPU model where the
    manifest has it, cores, architecture, platform), the target's kind and device, the
    serving stack's versions; runs that differ are joined with `` | ``."""
    lines: list[str] = []
    for meta in metas:
        host = meta.raw.get("host") or {}
        cpu = host.get("cpu_model") or host.get("processor")
        facts = [str(cpu)] if cpu else []
        if host.get("cpu_count"):
            facts.append(f"{host['cpu_count']} cores")
        facts += [str(host[k]) for k in ("machine", "platform") if host.get(k)]
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


def predict(f: pl.DataFrame, values: dict[str, float], knots: Sequence[int], kv: float) -> Any:
    """Modeled TTFT of each request under the fitted values (request overhead included)."""
    names = estimate.first_token_names(knots)
    coef = np.array([values.get(n, 0.0) for n in names])
    n, local, pool = (f[c].to_numpy().astype(np.float64) for c in ("n", "local", "pool"))
    zero, none = np.zeros_like(n), np.zeros(n.size, dtype=np.int64)
    r = Requests(n, local, pool, zero, zero, zero, none, none, none, _stores(f))
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


def kv_bytes_from(meta: RunMeta) -> int | None:
    """KV bytes per token of the run's model, where the manifest tells it."""
    profile = meta.target.get("profile") or {}
    if "kv_bytes_per_token" in profile:
        return int(profile["kv_bytes_per_token"])
    spec = meta.target.get("spec") or {}
    if spec.get("model") == BUILTIN_TINY:
        return tiny_kv_bytes_per_token()
    return None


def _header_lines(result: Fit) -> list[str]:
    """The values with intervals, what the intervals are over, the designs."""
    lines = []
    for k, v in result.values.items():
        lines.append(f"  {k:<24} {v:12.6g}  {result.interval_text(k)}")
    boot = result.resampling
    if boot is not None:
        if boot.runs > 1:
            unit = (
                f"unit: run, then session ({boot.runs} runs; {boot.sessions} sessions "
                f"resampled within each run, context size and cache arm, {boot.strata} "
                "strata)"
            )
        else:
            unit = (
                f"unit: session ({boot.sessions} sessions, resampled within each of "
                f"{boot.strata} strata: context size and cache arm)"
            )
        lines.append(
            f"intervals: {CONFIDENCE:.0%} percentile bootstrap, {unit}; {boot.resamples} "
            f"resamples, {boot.failed} failed"
        )
    if result.design is not None:
        design = result.design
        for label, ident in (("first token", design.first_token), ("decode", design.decode)):
            lines.append(
                f"design ({label}): {ident.columns} columns, rank {ident.rank}, condition "
                f"number {ident.condition:.3g} (columns at unit length)"
            )
    c = result.values.get(OVERHEAD)
    if c is not None and OVERHEAD not in result.not_identified:
        lines.append(
            f"the profile adds {OVERHEAD} ({c:.4g} s) to hit_overhead_s and "
            "pool_load_fixed_s (the simulator has no per-request term); it models cold "
            "requests short by it"
        )
    return lines


def profile_toml(result: Fit) -> str:
    """The fitted profile as a TOML file: ``[target.sim]``, then what it stands on
    (``[fit]``: provenance; ``[fit.interval]``: each identified key's 95% interval;
    ``[fit.model_error]``, with held-out runs: the model's own error per regime;
    ``[[fit.draw]]``: joint parameter draws), with the fit's report in comments."""
    lines = [
        "# sessiongen simulator profile fitted by `sessiongen fit` (load it with",
        "# --set target.sim.profile=THIS_FILE). Fitted values with their intervals:",
    ]
    lines += [f"# {line}" for line in _header_lines(result)]
    runs = ", ".join(Path(d).name for d in result.sources)  # run ids: no machine's paths
    lines.append(f"# from {result.requests} requests of runs: {runs}")
    lines += [f"# {line}" for line in result.warnings]
    lines += [f"# {line}" for line in _residual_lines(result)]
    lines += [f"# {line}" for line in _loaded_lines(result)]
    missing = structure.unknown(result.fixed)
    if missing:
        lines.append(f"# not told by the runs (set them for your pair): {', '.join(missing)}")
    lines.append("")
    lines.append("[target.sim]")
    for k, v in result.profile().items():
        lines.append(f"{k} = {_toml(v)}")
    lines += ["", "# What the profile stands on (scenario loading reads only [target.sim])."]
    lines += _fit_lines(result)
    draws = result.draws()
    if draws:
        lines += [
            "",
            f"# {len(draws)} joint draws of every fitted parameter (Fit.draws): `sessiongen plan",
            "# --seeds N` plans replicate k (k >= 1) with draw k - 1, N at most draws + 1.",
        ]
        for draw in draws:
            lines.append("[[fit.draw]]")
            lines += [f"{k} = {_toml(v)}" for k, v in draw.items()]
    return "\n".join(lines) + "\n"


def _fit_lines(result: Fit) -> list[str]:
    """``[fit]``, ``[fit.interval]`` and, when known, ``[fit.model_error]``."""
    runs = [Path(d).name for d in result.sources]  # run ids: no machine's paths
    command = " ".join(["sessiongen fit", *runs])
    if result.heldout:
        command += " " + " ".join(["--heldout", *(Path(d).name for d in result.heldout)])
    table: dict[str, object] = {
        "fitted": True,
        "date": result.date,
        "runs": runs,
        "hardware": result.hardware,
        "source": command,
        "requests": result.requests,
    }
    lines = ["[fit]", *(f"{k} = {_toml(v)}" for k, v in table.items())]
    lines += ["", "[fit.interval]  # 95%; keys the runs do not identify are absent"]
    lines += [f"{k} = {_toml([lo, hi])}" for k, (lo, hi) in result.intervals().items()]
    error = result.model_error
    if error:
        keys = [
            *(k for k in ("one_in_flight", "loaded") if k in error),
            *(k for k in ("cells_one_in_flight", "cells_loaded") if k in error),
            "source",
        ]
        lines += ["", "[fit.model_error]  # log-scale SD of planned / measured session gain"]
        lines += [f"{k} = {_toml(error[k])}" for k in keys]
    return lines


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    return str(value)


def summary_text(result: Fit) -> str:
    """The fitted values with intervals, then warnings and the residuals, as plain text."""
    lines = [f"fitted on {result.requests} requests that ran alone:"]
    lines += _header_lines(result)
    lines += list(result.warnings) + _residual_lines(result)
    return "\n".join(lines + _loaded_lines(result) + _model_error_lines(result))


def _model_error_lines(result: Fit) -> list[str]:
    error = result.model_error
    if not error:
        return []
    lines = [f"model error (log-scale SD of planned / measured session gain): {error['source']}"]
    for name in ("one_in_flight", "loaded"):
        if name in error:
            lines.append(f"  {name:<24} {error[name]:12.4g}  over {error[f'cells_{name}']} cells")
    return lines


def _loaded_lines(result: Fit) -> list[str]:
    from sessiongen.capacity import loaded

    if result.loaded is None:
        return [
            "loaded terms (itl_per_batch_s, pool_load_mode): not fitted, no run with "
            "sessions in flight together (scenarios/fitprobe-load.toml makes one); the "
            "profile keeps the defaults"
        ]
    return loaded.summary_lines(result.loaded)


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
