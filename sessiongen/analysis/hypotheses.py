"""Tests and one-sided bounds, pure and seeded like :mod:`.stats`: on log ratios, means,
shares and rates of failure.

Methods
-------
- **Welch-Satterthwaite** degrees of freedom of a sum of variance components with their
  own degrees of freedom (Satterthwaite 1946, *Biometrics Bulletin* 2:110), for a
  sampling error over ``n`` sessions (``n - 1`` df) plus a run-to-run noise that is
  given (infinite df) or estimated from replicate runs.
- **Log-ratio test** (:class:`LogTest`): a log ratio, its standard error and df; its
  interval and one-sided tests by Student's t (normal at infinite df).
- **Sign test** (:func:`sign_test_greater`): the exact binomial test that positive
  differences outnumber negative ones (ties dropped).
- **Bounds on a mean** (:func:`upper_mean_bound`, :func:`upper_difference_bound`,
  :func:`mean_exceeds`): one-sided Student t (Welch's for a difference) bounds and tests.
- **Replicate noise** (:func:`replicate_noise`): the run-to-run SD of a cell's log values
  over replicate runs, less each run's own sampling variance, with its df.
- **Proportions**: Wilson's score interval (Wilson 1927, *JASA* 22:209) and the exact
  Clopper-Pearson interval (Clopper & Pearson 1934, *Biometrika* 26:404), on an effective
  number of trials where units are clustered (:func:`clustered_share`).
- **Rates compared** (:func:`rate_exceeds`): Boschloo's unconditional exact test of two
  binomial rates (Boschloo 1970, *Statistica Neerlandica* 24:1), Fisher's exact test
  above a table-count limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sessiongen.analysis.stats import Array, finite
from sessiongen.infra.lazy import lazy_module

if TYPE_CHECKING:
    from scipy import special as spc
    from scipy import stats as sps
else:
    # scipy.special alone for the quantiles a plan needs (Clopper-Pearson, the clustered
    # share's t ratio): they are the functions scipy.stats' beta.ppf and t.ppf call, and
    # import in a third of the time
    spc = lazy_module("scipy.special")
    sps = lazy_module("scipy.stats")


def welch_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite df of a sum of variances ``(variance, df)`` (``inf`` df: known)."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if v > 0 and math.isfinite(df) and df > 0)
    if total <= 0:
        return math.inf
    return total * total / denom if denom > 0 else math.inf


@dataclass(frozen=True)
class LogTest:
    """A log ratio with its standard error and df: intervals and one-sided tests on it.

    ``estimate`` is ``log(B / A)``, ``se`` its standard error, ``df`` the degrees of
    freedom of ``se`` (Student's t; ``inf``: normal).
    """

    estimate: float
    se: float
    df: float

    def _t(self, bound: float) -> float:
        if self.se > 0:
            return (self.estimate - bound) / self.se
        diff = self.estimate - bound
        return math.inf if diff > 0 else -math.inf if diff < 0 else 0.0

    def p_above(self, ratio: float) -> float:
        """One-sided p-value of "B/A > ratio" (small: surely above)."""
        if math.isnan(self.estimate) or math.isnan(self.se):
            return 1.0
        return float(sps.t.sf(self._t(math.log(ratio)), self.df))

    def p_below(self, ratio: float) -> float:
        """One-sided p-value of "B/A < ratio" (small: surely below)."""
        if math.isnan(self.estimate) or math.isnan(self.se):
            return 1.0
        return float(sps.t.cdf(self._t(math.log(ratio)), self.df))

    def interval(self, conf: float) -> tuple[float, float]:
        """Two-sided ``conf`` interval of B/A (NaN when unknown)."""
        if not (math.isfinite(self.estimate) and math.isfinite(self.se)):
            return math.nan, math.nan
        half = float(sps.t.ppf(0.5 + conf / 2.0, self.df)) * self.se
        return math.exp(self.estimate - half), math.exp(self.estimate + half)


def sign_test_greater(diffs: npt.ArrayLike) -> float:
    """Exact one-sided sign test of "the differences tend to be positive" (zeros dropped).

    p = P(Binomial(n_+ + n_-, 1/2) >= n_+); 1 when no difference is positive.
    """
    x = finite(diffs)
    plus, minus = int((x > 0).sum()), int((x < 0).sum())
    if plus == 0:
        return 1.0
    return float(sps.binom.sf(plus - 1, plus + minus, 0.5))


def upper_mean_bound(values: npt.ArrayLike, *, conf: float) -> float:
    """One-sided upper ``conf`` bound of a mean (Student t); the value itself when all equal."""
    x = finite(values)
    if x.size == 0:
        return math.nan
    mean = float(x.mean())
    if x.size < 2:
        return math.inf if mean != 0 else 0.0
    sd = float(x.std(ddof=1))
    return mean + float(sps.t.ppf(conf, x.size - 1)) * sd / math.sqrt(x.size)


def replicate_noise(groups: Sequence[tuple[npt.ArrayLike, npt.ArrayLike]]) -> tuple[float, int]:
    """Run-to-run SD ``tau`` from replicate runs, and its degrees of freedom.

    Each group is one cell seen in ``k >= 2`` runs: ``(y, v)`` with ``y`` the runs'
    log values and ``v`` the sampling variance of each run's deviation from the group
    mean (what the request noise alone would give it; for runs of the same sessions a
    paired bootstrap estimates it, so the sessions' own spread, common to all runs,
    cancels). With ``y_r = mu + e_r + s_r``, ``var(e) = tau^2``:
    ``E[sum (y_r - ybar)^2] = (k - 1) tau^2 + sum v_r``, so pooled over the groups
    (the method of moments, as for a variance component beside known variances: Paule
    & Mandel 1982) ``tau^2 = max(0, (sum SS - sum v) / sum (k - 1))`` on
    ``sum (k - 1)`` degrees of freedom.
    """
    ss = explained = 0.0
    df = 0
    for y_raw, v_raw in groups:
        y = np.asarray(y_raw, dtype=np.float64)
        v = np.asarray(v_raw, dtype=np.float64)
        keep = np.isfinite(y) & np.isfinite(v)
        if keep.sum() < 2:
            continue
        yk = y[keep]
        ss += float(((yk - yk.mean()) ** 2).sum())
        explained += float(v[keep].sum())
        df += int(keep.sum()) - 1
    if df == 0:
        return math.nan, 0
    return math.sqrt(max(0.0, (ss - explained) / df)), df


def wilson(successes: float, n: float, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (Wilson 1927); (nan, nan) when ``n`` is 0."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson(successes: float, n: float, *, conf: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a proportion (Clopper & Pearson 1934, *Biometrika* 26:404).

    The bounds are Beta quantiles, ``B(alpha/2; x, n - x + 1)`` and ``B(1 - alpha/2; x + 1,
    n - x)``, which take non-integer ``x`` and ``n`` (an effective sample size) as they
    are. At ``x = n`` the upper end is exactly 1 and the lower ``(alpha / 2)^(1 / n)``; at
    ``x = 0`` the mirror image. (nan, nan) when ``n`` is 0.
    """
    if not 0.0 < conf < 1.0:
        raise ValueError(f"conf: expected 0 < conf < 1, got {conf}")
    if n <= 0:
        return math.nan, math.nan
    x = min(max(successes, 0.0), n)
    tail = (1.0 - conf) / 2.0
    low = 0.0 if x <= 0 else float(spc.betaincinv(x, n - x + 1, tail))
    high = 1.0 if x >= n else float(spc.betaincinv(x + 1, n - x, 1.0 - tail))
    return low, high


@dataclass(frozen=True)
class ClusteredShare:
    """A share of items whose units are clusters (turns of sessions), with its interval.

    ``n_items`` items in ``n_units`` clusters; ``n_effective`` what the interval rests
    on (``n_items / design_effect``, before the degrees-of-freedom adjustment).
    """

    share: float
    low: float
    high: float
    n_items: int
    n_units: int
    n_effective: float

    @property
    def design_effect(self) -> float:
        return self.n_items / self.n_effective if self.n_effective > 0 else math.nan


def clustered_share(
    successes: npt.ArrayLike, trials: npt.ArrayLike, *, conf: float = 0.95
) -> ClusteredShare:
    """The share ``sum(successes) / sum(trials)`` over clusters, with sessions as units.

    Turns of a session share prompts, a replica and queueing episodes, so they are not
    independent: when a session's turns are all good or all bad, a Wilson interval over
    turns covered about 58% instead of 95%. The method is Korn & Graubard's (1998,
    *Survey Methodology* 24:193, "Confidence intervals for proportions with small
    expected number of positive counts estimated from survey data"): the Clopper-Pearson
    interval (:func:`clopper_pearson`) on the effective sample size, with their
    degrees-of-freedom adjustment. Step by step, for ``k`` clusters of ``m_s`` trials
    with ``y_s`` successes, ``n = sum m_s`` and ``p = sum y_s / n``:

    1. the ratio estimator's variance over clusters (Cochran, *Sampling Techniques*, 3rd
       ed. 1977, sec. 6.13): ``var = sum (y_s - p m_s)^2 / (k (k - 1) mbar^2)``;
    2. Kish's design effect ``deff = var / (p (1 - p) / (n - 1))`` (the ``n - 1`` so that
       ``k`` clusters of one trial give ``deff`` near 1), held within ``[1, n]``, and the
       effective sample size ``n_eff = n / deff``;
    3. the df adjustment ``n* = n_eff (t_{n-1} / t_{k-1})^2`` at the ``(1 + conf) / 2``
       quantile: the clusters, not the trials, carry the variance, on ``k - 1`` df;
    4. Clopper-Pearson with ``p n*`` successes out of ``n*``.

    **All good (or all bad).** At ``p = 1`` (or 0) the clusters carry no variance to
    read and ``deff`` is ``0 / 0``. It is taken as 1, ``n_eff = n`` (as the NCHS data
    presentation standards for proportions, Parker et al. 2017, which implement Korn &
    Graubard, do). The reason is the ranking: a sample with a single bad turn, in
    whichever session, has ``deff = 1`` exactly (its residuals are ``1/k`` in ``k - 1``
    clusters and ``1/k - 1`` in one, so ``var = 1/n^2 = p (1 - p) / (n - 1)``), so
    ``n_eff = n`` is the estimator's own value one turn away, and the only one that keeps
    the lower end rising with the good turns: counting each cluster as one trial (``n_eff
    = k``, what this function did with Wilson's interval) ranked all good below 99% good
    (load128k: 1.00 [0.80, 1.00] against 0.99 [0.94, 1.00]). Its cost: no failure, no
    evidence of how failures cluster, so where failures come as whole sessions (every
    turn of a session bad or none) an all-good sample reads as if turns were independent;
    the interval then covers a true share ``q`` only while ``q^k``, the chance of seeing
    no bad session, is small or ``q`` is above ``(alpha / 2)^(1 / n*)``.
    Clopper-Pearson puts the upper end of an all-good sample at exactly 1 and is never
    below nominal for independent trials. A single cluster has no df to adjust (``z``).
    tests/unit/analysis/test_goodput_interval.py checks the ranking, monotonicity and
    coverage of clustered binomial data.
    """
    if not 0.0 < conf < 1.0:
        raise ValueError(f"conf: expected 0 < conf < 1, got {conf}")
    y_all: Array = np.asarray(successes, dtype=np.float64).ravel()
    m_all: Array = np.asarray(trials, dtype=np.float64).ravel()
    keep = m_all > 0
    y, m = y_all[keep], m_all[keep]
    k, n = int(m.size), float(m.sum())
    if k == 0:
        return ClusteredShare(math.nan, math.nan, math.nan, 0, 0, 0.0)
    p = float(y.sum()) / n
    n_eff = n  # all good or all bad: deff taken as 1 (docstring)
    if 0.0 < p < 1.0:
        n_eff = 1.0  # one cluster, some good, some bad: nothing to estimate deff from
        if k >= 2:
            var = float(((y - p * m) ** 2).sum()) / (k * (k - 1) * (n / k) ** 2)
            srs = p * (1 - p) / (n - 1)
            n_eff = n if var <= 0 else min(n, max(1.0, n * srs / var))
    n_star = n_eff
    if k >= 2 and n >= 2:
        q = 0.5 + conf / 2
        n_star = n_eff * (float(spc.stdtrit(n - 1, q)) / float(spc.stdtrit(k - 1, q))) ** 2
    low, high = clopper_pearson(p * n_star, n_star, conf=conf)
    return ClusteredShare(p, low, high, int(n), k, n_eff)


#: Above this many possible tables Boschloo's test is replaced by Fisher's (same level,
#: a little less power, milliseconds instead of seconds).
_BOSCHLOO_CELLS = 250_000


def rate_exceeds(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided exact p-value of "rate k1/n1 is higher than rate k0/n0".

    Boschloo's unconditional test (Boschloo 1970, *Statistica Neerlandica* 24:1), which
    is uniformly more powerful than Fisher's exact test at the same level (scipy's
    ``boschloo_exact``); Fisher's for large tables. 1 when ``k1`` is 0 or a sample is
    empty.
    """
    if n1 <= 0 or n0 <= 0 or k1 <= 0:
        return 1.0
    # scipy's boschloo_exact takes each *column* as one binomial sample.
    table = [[k1, k0], [n1 - k1, n0 - k0]]
    if (n1 + 1) * (n0 + 1) > _BOSCHLOO_CELLS:
        return float(sps.fisher_exact(table, alternative="greater").pvalue)
    return float(sps.boschloo_exact(table, alternative="greater").pvalue)


def upper_difference_bound(b: npt.ArrayLike, a: npt.ArrayLike, *, conf: float) -> float:
    """One-sided upper ``conf`` bound of ``mean(b) - mean(a)`` (Welch's t; infinite when a
    side has fewer than two values and the means differ)."""
    xb, xa = finite(b), finite(a)
    if xb.size == 0 or xa.size == 0:
        return math.nan
    diff = float(xb.mean() - xa.mean())
    if xb.size < 2 or xa.size < 2:
        return diff if diff <= 0 and xb.size >= 2 else (math.inf if diff != 0 else 0.0)
    vb, va = float(xb.var(ddof=1)) / xb.size, float(xa.var(ddof=1)) / xa.size
    if vb + va == 0:
        return diff
    df = welch_df([(vb, float(xb.size - 1)), (va, float(xa.size - 1))])
    return diff + float(sps.t.ppf(conf, df)) * math.sqrt(vb + va)


def mean_exceeds(values: npt.ArrayLike, bound: float = 0.0) -> float:
    """One-sided p-value of "the mean of ``values`` is above ``bound``" (Student's t).

    Values all alike give 0 when above the bound and 1 otherwise; fewer than two, 1.
    """
    x = finite(values)
    if x.size < 2:
        return 1.0
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if sd == 0:
        return 0.0 if mean > bound else 1.0
    return float(sps.t.sf((mean - bound) / (sd / math.sqrt(x.size)), x.size - 1))
