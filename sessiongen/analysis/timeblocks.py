"""Units for a trace's intervals: blocks of consecutive requests, their length chosen from
the data's autocorrelation.

A trace's requests share their replicas' queues: a request sent while the queue is long
is slow, and so are its neighbours in time. Resampling requests as if independent then
gives an interval far too narrow (on the public Mooncake conversation trace, [7.35, 7.85]
over requests against [6.10, 9.00] over five-minute windows of the same records). The
units are instead blocks of consecutive requests in arrival order (a block of time), each
resampled whole: Carlstein's (1986) non-overlapping block bootstrap, run by the paired
unit bootstrap that sessions use (:func:`sessiongen.analysis.stats.bootstrap_ratio`).

The block length is Politis & White's (2004) automatic choice with Patton, Politis &
White's (2009) correction, for the circular block bootstrap (the non-overlapping one has
the same bias order and a variance 3/2 as large, so its length is of the same order):

- ``m``: the smallest lag after which ``K = max(5, sqrt(log10 n))`` autocorrelations in a
  row lie within ``2 sqrt(log10(n) / n)`` (their flat-top rule); ``M = 2 m``;
- with the flat-top window ``lambda(t)`` (1 to 1/2, falling linearly to 0 at 1) and the
  autocovariances ``R(k)``: ``G = sum_{|k| <= M} lambda(k/M) |k| R(k)``,
  ``g = sum_{|k| <= M} lambda(k/M) R(k)``, ``D = 4/3 g^2``;
- ``b = (2 G^2 / D)^(1/3) n^(1/3)``, at least 1, at most ``min(3 sqrt(n), n / 3)``.

The series is each request's log OFF / ON time (the pair the gain's ratio is made of), in
the order of its scheduled arrival. Uncorrelated data gives ``b = 1``: requests are then
their own units, as before.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

#: The flat-top rule's band multiplier (Politis & White 2004 use c = 2).
BAND = 2.0


def _flat_top(t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    a = np.abs(t)
    out: npt.NDArray[np.float64] = np.where(a <= 0.5, 1.0, np.where(a <= 1.0, 2.0 * (1.0 - a), 0.0))
    return out


def block_length(series: npt.ArrayLike) -> int:
    """The block length (in values) for ``series`` (module doc); 1 for fewer than 8
    finite values or no autocorrelation."""
    x = np.asarray(series, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    if n < 8 or float(np.var(x)) == 0.0:
        return 1
    x = x - x.mean()
    k_n = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = min(n - 1, math.ceil(math.sqrt(n)) + k_n)
    # sums of products, not np.dot: BLAS splits a dot this long over threads, which on a
    # busy 2-core machine took 0.4-0.8 s for a 12k-request trace's 120 lags, against 2 ms
    cov = np.array([float(np.multiply(x[: n - k], x[k:]).sum()) / n for k in range(m_max + 1)])
    rho = cov / cov[0]
    band = BAND * math.sqrt(math.log10(n) / n)
    m = m_max
    for lag in range(m_max - k_n + 1):
        if np.all(np.abs(rho[lag + 1 : lag + 1 + k_n]) < band):
            m = lag
            break
    if m == 0:
        return 1
    big_m = min(2 * m, m_max)
    lags = np.arange(-big_m, big_m + 1)
    weights = _flat_top(lags / big_m)
    r = cov[np.abs(lags)]
    g_bias = float(np.sum(weights * np.abs(lags) * r))
    g_zero = float(np.sum(weights * r))
    d = 4.0 / 3.0 * g_zero * g_zero
    if d <= 0.0:
        return 1
    b = (2.0 * g_bias * g_bias / d) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    cap = max(1.0, min(3.0 * math.sqrt(n), n / 3.0))
    return int(max(1, min(round(b), cap)))


def block_ids(order: npt.ArrayLike, length: int) -> npt.NDArray[np.int64]:
    """Each value's block: ``rank // length`` by ``order`` (its arrival), the last block
    merged into the one before when shorter than half a block (a tail of a few requests
    is no unit of its own)."""
    keys = np.asarray(order, dtype=np.float64)
    ranks = np.empty(keys.size, dtype=np.int64)
    ranks[np.argsort(keys, kind="stable")] = np.arange(keys.size)
    ids = ranks // max(1, length)
    blocks = int(ids.max()) + 1 if ids.size else 0
    if blocks > 1 and keys.size - (blocks - 1) * length < length / 2:
        ids[ids == blocks - 1] = blocks - 2
    return ids
