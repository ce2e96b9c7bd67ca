"""Tail latencies told honestly: every percentile with its sample count, and a conservative
bound where the sample is too small for an empirical percentile to mean anything.

Method: MLPerf LoadGen's early-stopping estimate (mlcommons/inference, loadgen
``early_stopping.cc`` and ``results.cc``; the rules' appendix "Early Stopping"). With
``n`` latencies and a target percentile ``p``, each latency is above the true
``p``-quantile with probability ``1 - p``. ``min_passing(t)`` is the smallest ``h`` such
that, were the true quantile no higher, seeing at most ``t`` of ``h + t`` latencies above
it would have probability below ``1 - c`` (``c = 0.99``)::

    odds(h, t) = BinomCDF(t; h + t, 1 - p)
    min_passing(t) = min { h >= 1 : odds(h, t) < 1 - c }

The estimate discards the ``t - 1`` highest latencies and reports the largest of the
rest, for the largest ``t`` the sample supports (``n >= min_passing(t) + t``): the
``t``-th largest latency, a value the true ``p``-quantile lies below with confidence
``c``. With fewer than ``min_passing(1) + 1`` samples there is no estimate at all (64
for p90, 662 for p99); then the sample's maximum is only a lower bound on what the
percentile could be, and it is reported as such, never as "the p99".

Pure and exact (scipy's binomial CDF); nothing random.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import binom

#: LoadGen's confidence for early stopping (hard-coded there too).
CONFIDENCE = 0.99


@functools.lru_cache(maxsize=4096)
def min_passing(t: int, p: float, confidence: float = CONFIDENCE) -> int:
    """Smallest ``h`` with ``BinomCDF(t; h + t, 1 - p) < 1 - confidence`` (binary search)."""

    def odds(h: int) -> float:
        return float(binom.cdf(t, h + t, 1.0 - p))

    lo, hi = 1, 1
    while odds(hi) >= 1.0 - confidence:
        hi *= 2
    while lo < hi:  # odds falls as h grows
        mid = (lo + hi) // 2
        if odds(mid) < 1.0 - confidence:
            hi = mid
        else:
            lo = mid + 1
    return lo


def min_samples(p: float, confidence: float = CONFIDENCE) -> int:
    """The fewest latencies that give an early-stopping estimate of the ``p``-quantile."""
    return min_passing(1, p, confidence) + 1


@dataclass(frozen=True)
class Tail:
    """A tail percentile as it may honestly be stated.

    ``empirical`` is the sample's own quantile (nearest rank), ``bound`` the
    early-stopping estimate (a conservative upper value, at least ``empirical``) or,
    with too few samples, None. ``n`` is the sample size and ``needed`` how many an
    estimate takes. :attr:`value` is what a table should show.
    """

    p: float
    n: int
    empirical: float
    bound: float | None
    needed: int

    @property
    def enough(self) -> bool:
        return self.bound is not None

    @property
    def value(self) -> float:
        """The early-stopping estimate when there is one, else NaN (never the raw max)."""
        return self.bound if self.bound is not None else math.nan

    def text(self, fmt: str = ".3g") -> str:
        """``1.23 (n=80)``, or ``> 0.95 (n=12 of 64 needed)`` without enough samples."""
        if self.n == 0:
            return "-"
        if self.bound is not None:
            return f"{format(self.bound, fmt)} (n={self.n})"
        return f">= {format(self.empirical, fmt)} (n={self.n} of {self.needed} needed)"


def tail(values: npt.ArrayLike, p: float, confidence: float = CONFIDENCE) -> Tail:
    """The ``p``-quantile of ``values`` with its early-stopping bound (see the module)."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    x = x[np.isfinite(x)]
    n = int(x.size)
    needed = min_samples(p, confidence)
    if n == 0:
        return Tail(p, 0, math.nan, None, needed)
    rank = max(1, math.ceil(p * n))  # nearest rank
    empirical = float(x[rank - 1])
    if n < needed:
        # Not enough for an estimate; the maximum is what can be said (a lower bound).
        return Tail(p, n, float(x[-1]), None, needed)
    t = _largest_t(n, p, confidence)
    return Tail(p, n, empirical, float(x[n - t]), needed)


def _largest_t(n: int, p: float, confidence: float) -> int:
    """The largest ``t`` with ``n >= min_passing(t) + t`` (at least 1 when ``n`` suffices).

    ``min_passing(t) + t`` grows with ``t``, so a binary search finds it.
    """
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n >= min_passing(mid, p, confidence) + mid:
            lo = mid
        else:
            hi = mid - 1
    return lo
