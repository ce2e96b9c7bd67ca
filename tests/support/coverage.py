"""Coverage of the analysis's intervals at a given session count, on models with known truth.

A :class:`SessionModel` draws what one cell of an OFF, ON, ON, OFF run holds: per
session, ``blocks`` OFF and ``blocks`` ON TTFTs. Each session has a TTFT factor shared by
both arms (its prompt, its replica), its own speedup (how much of it the pool serves),
and each request a lognormal noise. In a mixture model (``hit_share`` set) a session's
speedup is ``speedup`` or 1x: cross-replica turns that the pool serves, and turns it
misses (evicted, never stored), the hard case for a median, whose sampling distribution
is then lumpy. The truth of each statistic (:data:`Statistic`) is the population's,
computed once from 400,000 sessions (Monte Carlo error below 0.1% for the medians,
below 0.2% for the p90s).

:func:`coverage` replays ``reps`` such cells through the interval method the analysis
uses and counts how often the interval holds the truth: the paired speedup
(:func:`sessiongen.analysis.stats.bootstrap_ratio`, as
:func:`sessiongen.analysis.latency.speedup_table`) at the median or another quantile,
or one arm's quantile with sessions as units
(:func:`sessiongen.analysis.stats.bootstrap_quantile`, as
:func:`sessiongen.analysis.latency.arm_turn_table` gives the p90 TTFT).
bench/interval_coverage.py prints the figures; the tests bound them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np
import numpy.typing as npt

from sessiongen.analysis import stats

Array = npt.NDArray[np.float64]
#: What an interval is of: the paired OFF / ON ratio of a quantile, or one arm's quantile.
Statistic = Literal["speedup", "off", "on"]


@dataclass(frozen=True)
class SessionModel:
    """Per-session and per-request variation of one cell (log-scale SDs)."""

    name: str = "synthetic"
    speedup: float = 4.0
    session_sigma: float = 0.3  # TTFT factor of a session, shared by both arms
    speedup_sigma: float = 0.1  # spread of the speedup between sessions
    noise_sigma: float = 0.06  # per request
    blocks: int = 2  # values per session and arm (OFF, ON, ON, OFF)
    hit_share: float | None = None  # mixture: share of sessions at ``speedup``, others 1x

    def draw(self, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
        """OFF and ON TTFT of ``n`` sessions: two ``n x blocks`` matrices."""
        factor = rng.lognormal(0.0, self.session_sigma, n)[:, None]
        spread = rng.lognormal(0.0, self.speedup_sigma, n)[:, None]
        if self.hit_share is None:
            speedup = self.speedup * spread
        else:
            hit = (rng.random(n) < self.hit_share)[:, None]
            speedup = np.where(hit, self.speedup, 1.0) * spread
        off = factor * rng.lognormal(0.0, self.noise_sigma, (n, self.blocks))
        on = factor / speedup * rng.lognormal(0.0, self.noise_sigma, (n, self.blocks))
        return off, on


#: Simulator-like (sessions nearly alike), the synthetic runs' default, sessions whose
#: speedups differ a lot (cross-replica hit fractions that vary), and half the sessions
#: served by the pool (4x) while the others miss it (1x).
MODELS = (
    SessionModel("alike", session_sigma=0.05, speedup_sigma=0.02),
    SessionModel("synthetic"),
    SessionModel("uneven speedups", session_sigma=0.1, speedup_sigma=0.2),
    SessionModel("hit/miss 1x|4x", session_sigma=0.1, speedup_sigma=0.05, hit_share=0.5),
)


@cache
def _population(model: SessionModel) -> tuple[Array, Array]:
    return model.draw(400_000, np.random.default_rng(12345))


@cache
def true_value(model: SessionModel, q: float = 0.5, of: Statistic = "speedup") -> float:
    """The population's ``q``-quantile OFF / ON (``speedup``) or of one arm's TTFT."""
    off, on = _population(model)
    if of == "speedup":
        return float(np.quantile(off, q) / np.quantile(on, q))
    return float(np.quantile(off if of == "off" else on, q))


def true_speedup(model: SessionModel) -> float:
    """Median OFF / median ON over 400,000 sessions (a fixed seed)."""
    return true_value(model)


def coverage(
    model: SessionModel,
    n: int,
    *,
    reps: int,
    conf: float = 0.95,
    expand: bool = True,
    q: float = 0.5,
    of: Statistic = "speedup",
    n_resamples: int = 1000,
    seed: int = 0,
) -> float:
    """Fraction of ``reps`` simulated cells whose interval of ``of`` at ``q`` holds the truth."""
    truth = true_value(model, q, of)
    boot = stats.Bootstrap(conf=conf, n_resamples=n_resamples, seed=seed, expand=expand)
    rng = np.random.default_rng([seed, n])
    hits = 0
    for rep in range(reps):
        off, on = model.draw(n, rng)
        opts = boot.options([seed, n, rep])
        if of == "speedup":
            ci = stats.bootstrap_ratio(off, on, q, paired=True, **opts)
        else:
            ci = stats.bootstrap_quantile(off if of == "off" else on, q, **opts)
        hits += ci.low <= truth <= ci.high
    return hits / reps
