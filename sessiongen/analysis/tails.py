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

**Correlated samples.** The estimate assumes independent latencies. Turns of one session
are not: they share a prompt, a replica and its queue, and 8 sessions of 8 identical
turns are 8 samples, not 64 (pooled, the "p90" was their maximum, which covers the true
p90 with probability ``1 - 0.9^8 = 57%``, not 99%). :func:`clustered_tail` therefore
runs the estimate on the **effective sample size** ``n_eff = n / deff``, with Kish's
design effect ``deff`` of the share of latencies above the empirical ``p``-quantile,
read over sessions as clusters (:func:`sessiongen.analysis.hypotheses.clustered_share`): at
most ``n`` (independent turns), as few as the number of sessions (turns that move
together). The order statistic is then the ``ceil(t * deff)``-th largest of the ``n``
latencies for the ``t`` the effective sample supports, the same share of the tail
discarded as with ``n_eff`` independent ones.

With too few samples there is no estimate, and the text says so: ``n/a (n of N
needed; max X)``. The sample's maximum is *not* a bound on the percentile: it lies
above the true ``p``-quantile only with probability ``1 - p^n``.

Pure and exact (the binomial CDF, as scipy's regularized incomplete beta); nothing
random.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sessiongen.analysis import hypotheses
from sessiongen.infra.lazy import lazy_module

if TYPE_CHECKING:
    from scipy import special as spc
else:
    spc = lazy_module("scipy.special")

#: LoadGen's confidence for early stopping (hard-coded there too).
CONFIDENCE = 0.99


def _check_p(p: float, confidence: float) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"p: expected 0 < p < 1, got {p}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: expected 0 < confidence < 1, got {confidence}")


@functools.lru_cache(maxsize=4096)
def min_passing(t: int, p: float, confidence: float = CONFIDENCE) -> int:
    """Smallest ``h`` with ``BinomCDF(t; h + t, 1 - p) < 1 - confidence`` (binary search)."""
    _check_p(p, confidence)

    def odds(h: int) -> float:
        # BinomCDF(t; n, q) = betaincc(t + 1, n - t, q), the regularized upper incomplete
        # beta; scipy.special imports in a third of scipy.stats' time, and
        # tests/unit/analysis/test_tails.py keeps the search equal to one on binom.cdf
        return float(spc.betaincc(t + 1.0, float(h), 1.0 - p))

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
    with too few samples, None. ``n`` is the sample size, ``n_effective`` what it is
    worth once correlated samples are accounted for (``n`` for independent ones),
    ``needed`` how many an estimate takes and ``maximum`` the largest sample.
    :attr:`value` is what a table should show.
    """

    p: float
    n: int
    empirical: float
    bound: float | None
    needed: int
    maximum: float = math.nan
    n_effective: float | None = None

    @property
    def enough(self) -> bool:
        return self.bound is not None

    @property
    def value(self) -> float:
        """The early-stopping estimate when there is one, else NaN (never the raw max)."""
        return self.bound if self.bound is not None else math.nan

    @property
    def effective(self) -> float:
        return float(self.n) if self.n_effective is None else self.n_effective

    def _size(self) -> str:
        if self.n_effective is None or self.n_effective >= self.n:
            return f"n={self.n}"
        return f"n={self.n}, effective {self.n_effective:.0f}"

    def text(self, fmt: str = ".3g") -> str:
        """``1.23 (n=80)``, or ``n/a (12 of 64 needed; max 0.95)`` without enough samples."""
        if self.n == 0:
            return "-"
        if self.bound is not None:
            return f"{format(self.bound, fmt)} ({self._size()})"
        have = f"{self.n}" if self.n_effective is None else f"{self.effective:.0f} effective"
        return f"n/a ({have} of {self.needed} needed; max {format(self.maximum, fmt)})"


def tail(values: npt.ArrayLike, p: float, confidence: float = CONFIDENCE) -> Tail:
    """The ``p``-quantile of independent ``values`` with its early-stopping bound."""
    return _tail(np.asarray(values, dtype=np.float64).ravel(), p, confidence, None)


def clustered_tail(
    values: npt.ArrayLike, units: npt.ArrayLike, p: float, confidence: float = CONFIDENCE
) -> Tail:
    """The ``p``-quantile of ``values`` whose ``units`` (sessions) are clusters.

    ``units`` labels each value's session; the estimate runs on the effective sample
    size (module docstring). Values without a finite latency are dropped.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    labels = np.asarray(units).ravel()
    keep = np.isfinite(x)
    x, labels = x[keep], labels[keep]
    if x.size == 0:
        return _tail(x, p, confidence, None)
    cut = float(np.sort(x)[max(1, math.ceil(p * x.size)) - 1])
    _, inverse = np.unique(labels, return_inverse=True)
    above = np.bincount(inverse, weights=(x > cut).astype(np.float64))
    trials = np.bincount(inverse).astype(np.float64)
    share = hypotheses.clustered_share(above, trials)
    # An empirical quantile with nothing above it (ties at the top) says nothing of
    # clustering: then each session is taken as one sample, the cautious reading.
    n_eff = share.n_effective if 0 < share.share < 1 else float(share.n_units)
    return _tail(x, p, confidence, min(float(x.size), n_eff))


def _tail(x: npt.NDArray[np.float64], p: float, confidence: float, n_eff: float | None) -> Tail:
    _check_p(p, confidence)
    x = np.sort(x[np.isfinite(x)])
    n = int(x.size)
    needed = min_samples(p, confidence)
    if n == 0:
        return Tail(p, 0, math.nan, None, needed)
    rank = max(1, math.ceil(p * n))  # nearest rank
    empirical = float(x[rank - 1])
    usable = n if n_eff is None else math.floor(n_eff + 1e-9)
    if usable < needed:
        return Tail(p, n, empirical, None, needed, float(x[-1]), n_eff)
    t = _largest_t(usable, p, confidence)
    from_top = t if n_eff is None else min(n, math.ceil(t * n / n_eff - 1e-9))
    return Tail(p, n, empirical, float(x[n - from_top]), needed, float(x[-1]), n_eff)


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
