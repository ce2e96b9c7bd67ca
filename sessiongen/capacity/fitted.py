"""A fitted profile (:class:`Fit`): values, intervals, joint draws, and what it stood on.

The value :mod:`.fit` returns and :mod:`.fitprofile` writes; the keys it fills
(``[target.sim]``'s), the confidence and the number of draws written are here, once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl

from sessiongen.capacity import estimate
from sessiongen.capacity.estimate import OVERHEAD, Identification
from sessiongen.capacity.loaded import LoadedFit
from sessiongen.errors import UserError


class FitError(UserError):
    """The runs do not contain what a parameter needs."""


RESAMPLES = 2000
STORE = "pool_store_s_per_gb"
NOISE = "prefill_noise_sigma"


#: Joint parameter draws written to the profile file for the planner (``[[fit.draw]]``):
#: ``sessiongen plan --seeds N`` gives replicate k >= 1 draw k - 1 and refuses N above
#: the draws + 1 (no draw used twice), so 100 allow --seeds up to 101, ten times the held-out
#: bench's 10. Size, measured: a draw is 0.49 kB of TOML (four overhead knots, no loaded
#: terms), so a profile of the synthetic probe run is 53 kB, 49 kB of it the draws;
#: `sessiongen fit` takes at least 1,000 resamples (--resamples), so they are there.
DRAWS_WRITTEN = 100
CONFIDENCE = 0.95


#: Bandwidth written when the transfer term is held at 0 or too small to measure (GB/s).
UNMEASURABLE_GBPS = 1e6
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
            values["pool_bandwidth_gbps"] = bandwidth(values["pool_s_per_gb"])
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


def bandwidth(s_per_gb: float) -> float:
    """GB/s from seconds per GB (capped where the runs could not see a transfer cost)."""
    if math.isnan(s_per_gb):
        return math.nan
    return min(UNMEASURABLE_GBPS, 1.0 / s_per_gb) if s_per_gb > 0 else UNMEASURABLE_GBPS
