"""Coverage of the speedup interval at a given session count, on a model with known truth.

A :class:`SessionModel` draws what one cell of an OFF, ON, ON, OFF run holds: per
session, ``blocks`` OFF and ``blocks`` ON TTFTs. Each session has a TTFT factor shared by
both arms (its prompt, its replica), its own speedup (how much of it the pool serves),
and each request a lognormal noise. The truth is the population's median OFF / median
ON, computed once from 400,000 sessions (its Monte Carlo error is below 0.1%).

:func:`coverage` replays ``reps`` such cells through the interval method the analysis
uses (:func:`sessiongen.analysis.stats.bootstrap_ratio`, paired) and counts how often
the interval holds the truth. bench/interval_coverage.py prints the figures; the tests
bound them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

from sessiongen.analysis import stats

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SessionModel:
    """Per-session and per-request variation of one cell (log-scale SDs)."""

    name: str = "synthetic"
    speedup: float = 4.0
    session_sigma: float = 0.3  # TTFT factor of a session, shared by both arms
    speedup_sigma: float = 0.1  # spread of the speedup between sessions
    noise_sigma: float = 0.06  # per request
    blocks: int = 2  # values per session and arm (OFF, ON, ON, OFF)

    def draw(self, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
        """OFF and ON TTFT of ``n`` sessions: two ``n x blocks`` matrices."""
        factor = rng.lognormal(0.0, self.session_sigma, n)[:, None]
        speedup = self.speedup * rng.lognormal(0.0, self.speedup_sigma, n)[:, None]
        off = factor * rng.lognormal(0.0, self.noise_sigma, (n, self.blocks))
        on = factor / speedup * rng.lognormal(0.0, self.noise_sigma, (n, self.blocks))
        return off, on


#: Simulator-like (sessions nearly alike), the synthetic runs' default, and sessions
#: whose speedups differ a lot (cross-replica hit fractions that vary).
MODELS = (
    SessionModel("alike", session_sigma=0.05, speedup_sigma=0.02),
    SessionModel("synthetic"),
    SessionModel("uneven speedups", session_sigma=0.1, speedup_sigma=0.2),
)


@cache
def true_speedup(model: SessionModel) -> float:
    """Median OFF / median ON over 400,000 sessions (a fixed seed)."""
    off, on = model.draw(400_000, np.random.default_rng(12345))
    return float(np.median(off) / np.median(on))


def coverage(
    model: SessionModel,
    n: int,
    *,
    reps: int,
    conf: float = 0.95,
    expand: bool = True,
    n_resamples: int = 1000,
    seed: int = 0,
) -> float:
    """Fraction of ``reps`` simulated cells whose paired interval holds the truth."""
    truth = true_speedup(model)
    rng = np.random.default_rng([seed, n])
    hits = 0
    for rep in range(reps):
        off, on = model.draw(n, rng)
        ci = stats.bootstrap_ratio(
            off,
            on,
            paired=True,
            conf=conf,
            n_resamples=n_resamples,
            seed=[seed, n, rep],
            expand=expand,
        )
        hits += ci.low <= truth <= ci.high
    return hits / reps
