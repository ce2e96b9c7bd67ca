r"""Change-point detection for nightly series: a penalized, robust piecewise-constant fit.

Pure functions on plain arrays; nothing here reads files or frames, and nothing is random.

Model
-----
A nightly series ``y_1..y_n`` (typically ``log`` of a median TTFT or of a speedup) is
piecewise constant plus noise. Night ``i``'s noise has two parts: the run's own
sampling error ``sigma_i``, known from its confidence interval (:func:`sigma_from_ci`),
and night-to-night noise ``tau`` (host, clock, process and restart luck) that no
interval of one run can see, so ``var_i = sigma_i^2 + tau^2``. The fit minimizes the
penalized cost (a *Potts functional*, or complexity-penalized M-estimation, Friedrich
et al. 2008, the approach asv's ``step_detect`` follows with an L1 cost)

.. math::

   \min_{k,\ t,\ \mu}\ \beta k + \sum_{r=0}^{k} \sum_{i \in \text{segment } r}
       \rho\!\left(\frac{y_i - \mu_r}{\sqrt{\sigma_i^2 + \tau^2}}\right)

over the number of changes ``k``, the change positions ``t`` and the levels ``mu``:

- ``rho`` is Huber's loss (Huber 1964): ``r**2 / 2`` for ``|r| <= c`` and ``c|r| -
  c**2/2`` beyond. Within ``c`` each point weighs ``1 / (sigma_i**2 + tau**2)`` (a
  least-squares fit that trusts tight intervals more, but no night more than the nights'
  noise allows); beyond it the cost grows only linearly, so one wild night cannot buy
  itself a segment (robust change-point detection with a bounded-influence loss, as in
  Fearnhead & Rigaill 2019, "Changepoint detection in the presence of outliers", JASA
  114:525). Segment levels are Huber M-estimates (iteratively reweighted least squares
  from the median).
- Every segment holds at least ``min_size`` finite points (default 2), the second
  guard against single outliers: a lone night can never be a level of its own.
- ``tau`` is estimated robustly from successive differences (:func:`night_noise`):
  ``E[(y_{i+1} - y_i)^2] = sigma_i^2 + sigma_{i+1}^2 + 2 tau^2`` (von Neumann's mean
  square successive difference, 1941; the moment equation of Paule & Mandel 1982 for a
  variance component beside known variances), solved on the differences with the largest
  30% trimmed and the rest made consistent at the normal (Huber & Ronchetti, *Robust
  Statistics*, 2nd ed. 2009, ch. 5). A step shows up in one difference and a lone
  outlier in two, which the trimming drops. One series of a week has six differences,
  too few: its estimate falls below 70% of the truth one time in five, and then a wobble
  looks like a step; so each estimate is taken at its 60% upper confidence bound (below
  70% of the truth one time in nine, at a week). And the check pools the differences
  of every series of a metric in the store (:func:`pooled_night_noise`) and each series
  uses the larger of that and its own estimate (a noisier cell keeps its own). An
  earlier version scaled the intervals by a common factor, floored at 1, instead: it
  could not add noise to nights whose intervals had zero width (one sample), whose
  weight then stayed arbitrary, and with narrow intervals it let 2 to 9 flat series in
  100 alarm per night (bench/trend_noise.py). Without intervals ``sigma_i = 0`` and
  ``tau`` is the data's own scale.
- ``beta`` is a Schwarz-type penalty per change, ``penalty_factor * log(n)`` (Yao 1988:
  a BIC penalty gives a consistent number of changes). The default factor 3 is above
  plain BIC (1 with this half-squared loss) because a nightly job checks dozens of series
  and a false alarm pages a person; tests/unit/trend/test_stepdetect.py and
  bench/trend_noise.py measure its false-alarm rate on flat noisy series.

The minimum is exact: optimal partitioning by dynamic programming (Jackson et al. 2005,
"An algorithm for optimal partitioning of data on an interval", IEEE SPL 12:105) with
PELT pruning (Killick, Fearnhead & Eckley 2012, JASA 107:1590), adapted to the minimum
segment length: a start pruned at ``t`` stays available until ``t + min_size``, since
only from there on can a segment begin at ``t``. NaN values (gaps: nights where a series
has no value) are skipped; positions in the result index the input, gaps included.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq
from scipy.stats import chi2, norm

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]

#: Huber's tuning constant on standardized residuals (downweights nights beyond 2 sigma).
HUBER_C = 2.0
#: Penalty per change is ``PENALTY_FACTOR * log(n)`` (see the module docstring).
PENALTY_FACTOR = 3.0
#: Fraction of the largest successive differences left out of the night noise.
TRIM = 0.3
#: Night noise estimates are taken at this upper confidence bound (see night_noise).
NOISE_UPPER = 0.6
_IRLS_STEPS = 12


@dataclass(frozen=True)
class Segment:
    """One constant level of a fit.

    ``start``/``end`` index the input series (``end`` exclusive); gaps inside or right
    after a segment belong to it. ``n`` counts its finite points and ``stderr`` is the
    standard error of ``level`` from the points' (scaled) sigmas.
    """

    start: int
    end: int
    level: float
    n: int
    stderr: float


@dataclass(frozen=True)
class StepFit:
    """The best piecewise-constant fit of a series, and what it was fitted with."""

    segments: tuple[Segment, ...]
    penalty: float
    night_noise: float  # tau, the SD added to every night's own (see fit_steps)
    values: Array = field(default_factory=lambda: np.empty(0), repr=False, compare=False)

    @property
    def steps(self) -> list[int]:
        """Input positions where a new level starts (the first point of each later segment)."""
        return [seg.start for seg in self.segments[1:]]

    def fitted(self) -> Array:
        """The fitted level at every input position (NaN where nothing was fitted)."""
        size = self.segments[-1].end if self.segments else 0
        out = np.full(size, np.nan)
        for seg in self.segments:
            out[seg.start : seg.end] = seg.level
        return out


@dataclass(frozen=True)
class Shift:
    """The newest change of level: where it started, the levels around it, its length."""

    at: int  # input position of the first point at the new level
    before: float
    after: float
    nights: int  # points of the newest segment on the new level's side, from ``at`` on


def sigma_from_ci(
    low: npt.ArrayLike, high: npt.ArrayLike, conf: float = 0.95, log: bool = True
) -> Array:
    """Standard deviations implied by two-sided ``conf`` intervals, assuming normality.

    With ``log`` the interval is taken on the log scale (latencies and ratios are
    multiplicative), so ``sigma = (ln high - ln low) / (2 z)``. Missing or invalid
    intervals give NaN, which :func:`fit_steps` treats as "unknown, use the data's scale".
    """
    z = float(_norm_ppf(0.5 + conf / 2))
    lo = np.asarray(low, dtype=np.float64)
    hi = np.asarray(high, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        width = (np.log(hi) - np.log(lo)) if log else (hi - lo)
    sigma = width / (2 * z)
    return np.where(np.isfinite(sigma) & (sigma >= 0), sigma, np.nan)


def _norm_ppf(p: float) -> float:
    return float(norm.ppf(p))


def _trimmed_rms(values: Array, trim: float = TRIM) -> float:
    """SD of zero-centred values from their trimmed root mean square (robust to a few jumps).

    The largest ``trim`` fraction of ``|values|`` (at least one value once there are 4) is
    dropped, and the mean square of the rest is divided by the variance of a standard
    normal truncated to the same central fraction, so the estimate is consistent at the
    normal. Much more efficient than the median absolute value with a week of nights.
    """
    m = values.size
    if m == 0:
        return 0.0
    dropped = max(1, math.floor(trim * m)) if m >= 4 else 0
    kept = np.sort(values**2)[: m - dropped]
    alpha = dropped / m
    if alpha == 0:
        return math.sqrt(float(kept.mean()))
    q = _norm_ppf(1 - alpha / 2)
    truncated_var = 1 - 2 * q * math.exp(-q * q / 2) / math.sqrt(2 * math.pi) / (1 - alpha)
    return math.sqrt(float(kept.mean()) / truncated_var)


def _differences(y: Array, sigma: Array | None) -> tuple[Array, Array]:
    """Successive differences of the finite points and the variance their sigmas explain."""
    keep = np.isfinite(y)
    yk = y[keep]
    sk = _prepare_sigma(None if sigma is None else sigma[keep], yk.size)
    return np.diff(yk), sk[1:] ** 2 + sk[:-1] ** 2


@functools.cache
def _target_rms(m: int, upper: float | None) -> float:
    """Trimmed RMS of ``m`` standardized differences at the ``upper`` confidence bound.

    ``None``: 1, the point estimate. Else the trimmed mean square of the ``k``
    differences kept is taken as ``chi2_k / k`` (an approximation: the trimmed ones
    carry a little information too, so the bound is a little wide), and the bound
    solves ``trimmed RMS = sqrt(chi2_k.ppf(1 - upper) / k)``.
    """
    if upper is None:
        return 1.0
    k = m - (max(1, math.floor(TRIM * m)) if m >= 4 else 0)
    return math.sqrt(float(chi2.ppf(1.0 - upper, k)) / k)


def _solve_night_noise(diffs: Array, explained: Array, upper: float | None) -> float:
    """The ``tau >= 0`` at which ``diffs / sqrt(explained + 2 tau**2)`` has the trimmed
    RMS of :func:`_target_rms` (0 when the intervals already explain the differences)."""
    if diffs.size < 2 or not np.any(diffs):
        return 0.0
    target = _target_rms(int(diffs.size), upper)

    def excess(tau: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            z = diffs / np.sqrt(explained + 2.0 * tau * tau)
        z = np.where(diffs == 0, 0.0, z)  # 0 / 0 at tau = 0: no evidence either way
        return _trimmed_rms(z) - target

    if excess(0.0) <= 0:
        return 0.0
    high = math.sqrt(float(np.max(diffs**2) + np.max(explained)))
    while excess(high) > 0:
        high *= 4.0
    return float(brentq(excess, 0.0, high, xtol=1e-12 * high + 1e-15))


def night_noise(
    y: Array, sigma: Array | None = None, *, upper: float | None = NOISE_UPPER
) -> float:
    """Robust SD ``tau`` of the night-to-night noise the intervals do not explain.

    With ``d_i = y_{i+1} - y_i``, ``E[d_i^2] = sigma_i^2 + sigma_{i+1}^2 + 2 tau^2``
    (von Neumann's mean square successive difference, 1941, generalized to unequal
    known variances as in Paule & Mandel 1982). ``tau`` solves the moment equation on
    the trimmed standardized differences (:func:`_trimmed_rms`), so one step or lone
    outlier in the series does not inflate it, at its ``upper`` confidence bound
    (:data:`NOISE_UPPER`, 60%; ``None``: the point estimate). A series' handful of
    differences often happens to be quiet, and a noise estimate that is too small turns
    wobbles into steps: at a week of nights the point estimate falls below 70% of the
    truth one time in five, the 60% bound one time in nine. Measured on six nights of 18
    series with narrow intervals and two cells three and five times noisier than the
    rest, checked on nights 4 to 6: the method before this one (a common scale on the
    intervals) alarmed somewhere in 60% of such histories and in the loud cells in 16%;
    pooled noise with each series' point estimate in 14% and 11%; with the 60% bound in
    5% and 4%, at a small cost in power (bench/trend_noise.py).
    """
    return _solve_night_noise(*_differences(y, sigma), upper)


def pooled_night_noise(
    series: Sequence[tuple[Array, Array | None]], *, upper: float | None = NOISE_UPPER
) -> float:
    """:func:`night_noise` from the differences of many series at once.

    A store holds dozens of series of one metric over the same nights: pooled, their
    hundreds of differences estimate ``tau`` far better than one series' handful (a
    week of nights gives 6), and the upper bound is then close to the point estimate.
    """
    parts = [_differences(y, sigma) for y, sigma in series]
    if not parts:
        return 0.0
    diffs = np.concatenate([d for d, _ in parts])
    return _solve_night_noise(diffs, np.concatenate([v for _, v in parts]), upper)


def _prepare_sigma(sigma: Array | None, size: int) -> Array:
    """Per-point sigma from the intervals: given values where valid, their median elsewhere.

    A zero-width interval (one sample) or a missing one says nothing about the night:
    it gets the typical sigma of the others. Very tight intervals are floored at a
    quarter of the typical one. Without any valid interval every point gets 0, and the
    night noise (:func:`night_noise`, then in the data's own units) does all the work.
    """
    if sigma is None:
        return np.zeros(size)
    good = np.isfinite(sigma) & (sigma > 0)
    if not good.any():
        return np.zeros(size)
    typical = float(np.median(sigma[good]))
    return np.where(good, np.maximum(sigma, 0.25 * typical), typical)


def _row_medians(values: Array, valid: npt.NDArray[np.bool_]) -> Array:
    """Median of the finite values of each row; every row has one (sorting puts NaN last)."""
    ordered = np.sort(np.where(valid, values, np.nan), axis=1)
    count = valid.sum(axis=1)
    rows = np.arange(values.shape[0])
    return np.asarray(0.5 * (ordered[rows, (count - 1) // 2] + ordered[rows, count // 2]))


def _huber_rows(values: Array, sigmas: Array, c: float) -> tuple[Array, Array, Array]:
    """Huber location, cost and standard error of each row (NaN-padded rows allowed)."""
    valid = np.isfinite(values)
    vals = np.where(valid, values, 0.0)
    inv_var = np.where(valid, 1.0 / np.where(valid, sigmas, 1.0) ** 2, 0.0)
    level = _row_medians(values, valid)
    for _ in range(_IRLS_STEPS):
        resid = np.abs(vals - level[:, None]) * np.sqrt(inv_var)
        down = np.where(resid > c, c / np.maximum(resid, 1e-300), 1.0)
        weights = inv_var * down
        updated = (weights * vals).sum(axis=1) / weights.sum(axis=1)
        done = np.all(np.abs(updated - level) * np.sqrt(inv_var.max(axis=1)) < 1e-9)
        level = updated
        if done:
            break
    resid = np.abs(vals - level[:, None]) * np.sqrt(inv_var)
    rho = np.where(resid <= c, 0.5 * resid**2, c * resid - 0.5 * c * c)
    cost = np.where(valid, rho, 0.0).sum(axis=1)
    stderr = 1.0 / np.sqrt(inv_var.sum(axis=1))
    return level, cost, stderr


def _segment_costs(y: Array, sig: Array, starts: Index, end: int, c: float) -> Array:
    """Cost of ``y[s:end]`` for every start ``s`` in ``starts``, vectorized."""
    first = int(starts.min())
    cols = np.arange(first, end)
    mask = cols[None, :] >= starts[:, None]
    values = np.where(mask, y[first:end][None, :], np.nan)
    sigmas = np.where(mask, sig[first:end][None, :], 1.0)
    return _huber_rows(values, sigmas, c)[1]


def _partition(y: Array, sig: Array, beta: float, min_size: int, c: float) -> list[int]:
    """Optimal partitioning with PELT pruning; returns the segment boundaries (0..n)."""
    n = y.size
    best = np.full(n + 1, np.inf)
    best[0] = -beta
    back = np.zeros(n + 1, dtype=np.int64)
    expiry: dict[int, float] = {0: math.inf}  # candidate start -> first t it is dead at
    for t in range(min_size, n + 1):
        live = [s for s, dead in expiry.items() if t < dead and t - s >= min_size]
        if live:
            starts = np.asarray(live, dtype=np.int64)
            totals = best[starts] + _segment_costs(y, sig, starts, t, c)
            pick = int(np.argmin(totals))
            best[t] = totals[pick] + beta
            back[t] = starts[pick]
            for s, total in zip(live, totals, strict=True):
                if total > best[t] and expiry[s] == math.inf:
                    expiry[s] = t + min_size
        expiry = {s: d for s, d in expiry.items() if t < d}
        if np.isfinite(best[t]):
            expiry[t] = math.inf
    bounds = [n]
    while bounds[-1] > 0:
        bounds.append(int(back[bounds[-1]]))
    return bounds[::-1]


def fit_steps(
    values: Sequence[float] | npt.ArrayLike,
    sigma: Sequence[float] | npt.ArrayLike | None = None,
    *,
    night_noise_prior: float | None = None,
    penalty: float | None = None,
    penalty_factor: float = PENALTY_FACTOR,
    min_size: int = 2,
    huber_c: float = HUBER_C,
) -> StepFit:
    """Fit a penalized, robust piecewise-constant model (see the module docstring).

    ``sigma`` gives each point's standard deviation from its interval (NaN or 0:
    unknown). Each point's total SD is ``sqrt(sigma_i**2 + tau**2)``, with ``tau`` the
    larger of this series' own :func:`night_noise` and ``night_noise_prior`` (typically
    :func:`pooled_night_noise` of the store's series of the same metric). ``penalty``
    overrides ``penalty_factor * log(n)``. A series with fewer than ``2 * min_size``
    finite points gets one segment. An empty series gets none.
    """
    if min_size < 1:
        raise ValueError("min_size: expected >= 1")
    raw = np.asarray(values, dtype=np.float64).ravel()
    keep = np.flatnonzero(np.isfinite(raw)).astype(np.int64)
    if keep.size == 0:
        return StepFit((), 0.0, night_noise_prior or 0.0, raw)
    y = raw[keep]
    given = None if sigma is None else np.asarray(sigma, dtype=np.float64).ravel()[keep]
    sig = _prepare_sigma(given, y.size)
    own = night_noise(y, sig)
    tau = own if night_noise_prior is None else max(night_noise_prior, own)
    floor = 1e-9 * max(1.0, float(np.median(np.abs(y))))
    total = np.maximum(np.sqrt(sig**2 + tau**2), floor)
    beta = penalty if penalty is not None else penalty_factor * math.log(max(y.size, 2))
    bounds = [0, y.size]
    if y.size >= 2 * min_size:
        bounds = _partition(y, total, beta, min_size, huber_c)
    segments = _segments(raw.size, keep, y, total, bounds, huber_c)
    return StepFit(segments, beta, tau, raw)


def _segments(
    size: int, keep: Index, y: Array, sig: Array, bounds: list[int], c: float
) -> tuple[Segment, ...]:
    """Segments in input positions from boundaries over the finite points."""
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        level, _cost, stderr = _huber_rows(y[None, a:b], sig[None, a:b], c)
        start = 0 if i == 0 else int(keep[a])
        end = size if b == y.size else int(keep[b])
        out.append(Segment(start, end, float(level[0]), b - a, float(stderr[0])))
    return tuple(out)


def latest_shift(fit: StepFit) -> Shift | None:
    """The newest change of level of a fit, or None when the fit has a single level.

    Only points past the midpoint between the two levels count as being at the new level:
    with a minimum segment length, a change on the newest night alone is fitted by
    lending it the night before (Huber's loss makes that one night cheap to misfit), and
    that borrowed night must neither count towards persistence nor date the change.
    """
    if len(fit.segments) < 2:
        return None
    prev, last = fit.segments[-2], fit.segments[-1]
    values = fit.values[last.start : last.end]
    direction = 1.0 if last.level >= prev.level else -1.0
    beyond = direction * (values - (prev.level + last.level) / 2) > 0  # NaN compares False
    if not beyond.any():
        return None
    first = int(np.argmax(beyond))
    nights = int(beyond[first:].sum())
    return Shift(at=last.start + first, before=prev.level, after=last.level, nights=nights)
