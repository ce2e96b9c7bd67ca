"""Pure, seeded statistics for latency samples: bootstrap intervals and rank tests.

Every function here takes plain numbers and returns plain numbers; nothing reads files
or frames. Randomness comes only from the ``seed`` argument, so a result is reproducible.

Methods
-------
- **Percentile bootstrap** (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993,
  ch. 13): resample the data with replacement ``n_resamples`` times, compute the statistic
  on each resample, and take the ``(1 - conf) / 2`` and ``(1 + conf) / 2`` quantiles of
  those values as the interval. Resampling is vectorized with numpy on counts (one
  matrix of how often each unit is drawn per chunk; each draw's quantile read from the
  values sorted once, weighted by those counts), so 2000 resamples take milliseconds.
- **Paired (cluster) bootstrap**: when two samples come from the same units (the same
  session replayed in both cache arms), whole units are resampled, and the same drawn
  units are used for both samples. Each unit may hold several values (one per block);
  missing values are NaN and ignored. This keeps the between-session variation out of a
  ratio's interval (Davison & Hinkley, *Bootstrap Methods and their Application*, 1997,
  sec. 3.8, resampling clusters).
- **Ratio of quantiles**: ``quantile(num) / quantile(den)``; its interval is the
  percentile interval of the resampled ratios.
- **Expanded percentile interval** (Hesterberg, "What teachers should know about the
  bootstrap", *The American Statistician* 69:371, 2015, sec. 5.2): with ``n`` resampled
  units the percentile interval is too narrow by about ``sqrt((n - 1) / n)`` and uses
  normal rather than Student quantiles. The expansion takes the bootstrap quantiles at
  ``alpha' / 2 = Phi(-sqrt(n / (n - 1)) t_{alpha/2, n-1})`` instead of ``alpha / 2``
  (:func:`expanded_conf`). bench/interval_coverage.py measures what it buys for the
  speedup interval (docs/concepts/statistics.md): at 4 sessions the coverage of a nominal 95%
  interval rises from 84-88% to 89-93% over unimodal models of per-session variation
  (a hit/miss mixture gains nothing there: 87%, its resamples take few values); at 8,
  from 89% to 96% for the mixture; at 2 sessions (3 distinct resamples) nothing helps
  (48-53%), hence :data:`MIN_SESSIONS`. It does not rescue a p90: see
  :mod:`sessiongen.analysis.adequacy`.
- **Student t interval** of a mean (Student 1908, *Biometrika* 6:1): ``mean +- t_{n-1}
  s / sqrt(n)``, exact for normal data at any ``n >= 2``; used on logs of ratios.
- **Mann-Whitney U** (scipy.stats.mannwhitneyu, asymptotic with tie and continuity
  correction, exact for small tie-free samples): a rank test that suits skewed latencies.
  Its effect size is the probability of superiority ``P(B > A) + P(B = A) / 2 = U_B /
  (n_A n_B)`` (McGraw & Wong 1992, the "common language" effect size).
- **Holm-Bonferroni** step-down adjustment for a family of p-values (Holm 1979): the
  family-wise error rate stays at most ``alpha`` however many cells are tested.
- **Log-scale bootstrap standard error** (:func:`log_quantile_draws`, :func:`robust_sd`):
  the spread of the bootstrapped log quantiles, read off their 15.9 and 84.1 percentiles
  (one SD either side at the normal, and finite even when a few resamples are extreme),
  times ``sqrt(n / (n - 1))``, the small-sample correction the expanded percentile
  interval makes (the bootstrap's plug-in variance divides by ``n``, not ``n - 1``).
  Failed requests count as slower than any finished one: they enter as :data:`FAILED`,
  so a quantile that lands on a failure is "failed", never a fast value.
- **Welch-Satterthwaite** degrees of freedom of a sum of variance components with their
  own degrees of freedom (Satterthwaite 1946, *Biometrics Bulletin* 2:110), for a
  sampling error over ``n`` sessions (``n - 1`` df) plus a run-to-run noise that is
  given (infinite df) or estimated from replicate runs.
- **Deciding on an interval** (:func:`decide_ratio`): a ratio B/A is "slower" when its
  whole ``1 - 2 alpha`` interval lies above ``1 + threshold``, "faster" when wholly below
  ``1 - threshold`` (each a one-sided test at level ``alpha``), "no change" when it lies
  within ``[1 - threshold, 1 + threshold]``: the two one-sided tests (TOST) of
  equivalence at level ``alpha``, which is why a 5% test reads a 90% interval
  (Schuirmann 1987, *J. Pharmacokinetics and Biopharmaceutics* 15:657). Otherwise the
  data cannot tell ("inconclusive"). "No change" over many cells at once is an
  intersection-union test, valid at ``alpha`` without adjustment (Berger 1982,
  *Technometrics* 24:295).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

Array = npt.NDArray[np.float64]
SeedLike = int | Sequence[int]

#: What a failed request counts as in a quantile, in seconds: larger than any latency, yet
#: finite, so interpolated quantiles and logs stay defined (log(FAILED) ~ 20.7).
FAILED = 1e9
#: A quantile at or above this is "failed": it landed on (or between) failed requests.
FAILED_FROM = FAILED / 4
#: Upper bound on elements in one resample matrix (keeps memory near 32 MB).
_CHUNK_ELEMENTS = 1 << 22
#: Fewest resampled sessions for which the (expanded, paired) percentile interval of a
#: speedup covers near its nominal level. bench/interval_coverage.py measured the
#: coverage of nominal 95% intervals over four models of per-session variation: 48-53%
#: at 2 sessions, 75-82% at 3, 87-93% at 4, 94-96% at 5, 96-99% at 6 and 8
#: (:data:`sessiongen.analysis.adequacy.MEASURED_COVERAGE`, docs/concepts/statistics.md).
MIN_SESSIONS = 5


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval.

    ``n`` counts the values (or, for paired resampling, the units) behind the estimate.
    An empty sample gives NaN everywhere; a sample of one gives a zero-width interval.
    ``log_se`` is the bootstrap standard error of ``log(estimate)`` (:func:`log_se`):
    what a later reader (the trend) needs, whatever level and expansion the interval has.
    """

    estimate: float
    low: float
    high: float
    n: int
    log_se: float = math.nan

    def excludes(self, value: float) -> bool:
        """True when ``value`` lies outside the interval (NaN intervals exclude nothing)."""
        return bool(self.low > value or self.high < value)


@dataclass(frozen=True)
class MannWhitney:
    """A Mann-Whitney U test of B against A and its effect size."""

    u_b: float  # U statistic of sample B
    p_value: float
    prob_b_greater: float  # P(B > A) + P(B = A) / 2


def stable_seed(seed: int, *key: object) -> list[int]:
    """A seed for ``numpy.random.default_rng`` derived from ``seed`` and a group key.

    Each group (arm, turn, ...) then gets its own reproducible stream, independent of the
    order in which groups are processed.
    """
    text = "\x1f".join(str(part) for part in key)
    return [int(seed), zlib.crc32(text.encode("utf-8"))]


def _clean(values: npt.ArrayLike) -> Array:
    arr: Array = np.asarray(values, dtype=np.float64).ravel()
    kept: Array = arr[np.isfinite(arr)]
    return kept


def _units(values: npt.ArrayLike) -> Array:
    """Values as a 2-D (units x per-unit values) matrix; 1-D input is one value per unit."""
    arr: Array = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError("expected a 1-D sample or a 2-D units x values matrix")
    arr = np.where(np.isfinite(arr), arr, np.nan)
    return arr[~np.all(np.isnan(arr), axis=1)] if arr.shape[0] else arr


def _resample_stat(
    mats: Sequence[Array], q: float, n_resamples: int, rng: np.random.Generator
) -> list[Array]:
    """Quantile of each matrix over ``n_resamples`` draws of the same unit indices.

    On counts (:class:`_Sorted`): a draw is how many times it took each unit, and each
    matrix's quantile is read from its values sorted once, weighted by their unit's count,
    with numpy's interpolation (``linear``, NaN ignored): the same figures as the
    quantile of the drawn values, without copying or partitioning them (issue 34: 2000
    draws of 12k sessions went from 2.2 s to 0.3 s).
    """
    n_units = mats[0].shape[0]
    width = sum(m.shape[1] for m in mats)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, n_units * width))
    sorted_mats = [_Sorted(mat) for mat in mats]
    out: list[list[Array]] = [[] for _ in mats]
    done = 0
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        idx = rng.integers(0, n_units, size=(size, n_units))
        rows = np.arange(size)[:, None] * n_units
        counts = np.bincount((idx + rows).ravel(), minlength=size * n_units)
        counts = counts.reshape(size, n_units)
        for slot, values in enumerate(sorted_mats):
            out[slot].append(values.quantiles(counts, q))
        done += size
    return [np.concatenate(parts) for parts in out]


class _Sorted:
    """A units x values matrix's values, NaN dropped, sorted, each with its unit's row."""

    def __init__(self, mat: Array) -> None:
        flat = mat.ravel()
        kept = np.flatnonzero(~np.isnan(flat))
        order = np.argsort(flat[kept], kind="stable")
        self.values: Array = flat[kept][order]
        self.units = (kept // max(mat.shape[1], 1))[order]
        self.per_unit = np.bincount(self.units, minlength=mat.shape[0])
        self.prefix: npt.NDArray[np.int64] | None = None
        if mat.shape[0] * (self.values.size + 1) <= _CHUNK_ELEMENTS:
            # few wide units (time blocks): how many of each unit's values come before
            # each position of the sorted values, for a binary search per draw
            seen = np.zeros((mat.shape[0], self.values.size + 1), dtype=np.int64)
            seen[self.units, np.arange(1, self.values.size + 1)] = 1
            self.prefix = np.cumsum(seen, axis=1)

    def quantiles(self, counts: npt.NDArray[np.int64], q: float) -> Array:
        """The ``q``-quantile of each draw (a row of ``counts``: times each unit drawn),
        as ``np.nanquantile`` of the drawn values computes it."""
        size = counts.shape[0]
        if self.values.size == 0:
            return np.full(size, np.nan)
        taken = (counts * self.per_unit).sum(axis=1)  # integers: no BLAS threads
        virtual = (taken - 1) * q  # numpy's "linear" virtual index
        below = np.floor(virtual)
        at_end = virtual >= taken - 1
        prev = np.where(at_end, taken - 1, below).astype(np.int64)
        nxt = np.where(at_end, taken - 1, below + 1).astype(np.int64)
        a, b = self.values[self._positions(counts, np.stack([prev, nxt]))]
        gamma = virtual - np.where(at_end, -1, below)
        # numpy's _lerp, term for term, so the figures are the same to the bit
        diff = b - a
        out: Array = a + diff * gamma
        high = gamma >= 0.5
        out[high] = (b - diff * (1 - gamma))[high]
        out[taken == 0] = np.nan
        return out

    def _positions(
        self, counts: npt.NDArray[np.int64], at: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """Per draw (column of ``at``), the sorted value at each position of the drawn
        values: the first whose running count (values sorted, each its unit's count)
        exceeds the position."""
        size, width = counts.shape[0], self.values.size
        if self.prefix is not None:  # binary search: running count = counts . prefix
            lo = np.zeros_like(at)
            hi = np.full_like(at, width - 1)
            for _ in range(max(width, 1).bit_length()):
                mid = (lo + hi) // 2
                running = np.einsum("su,ups->ps", counts, self.prefix[:, mid + 1])
                over = running > at
                hi = np.where(over, mid, hi)
                lo = np.where(over, lo, mid + 1)
            return lo
        cum = np.cumsum(counts[:, self.units], axis=1)
        span = int(cum[:, -1].max()) + 1
        rows = np.arange(size)
        flat = (cum + rows[:, None] * span).ravel()
        found: npt.NDArray[np.int64] = (
            np.searchsorted(flat, at + rows * span, side="right") - rows * width
        )
        return found


def _percentiles(boot: Array, conf: float) -> tuple[float, float]:
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return math.nan, math.nan
    tail = (1.0 - conf) / 2.0
    low, high = np.quantile(boot, [tail, 1.0 - tail])
    return float(low), float(high)


def expanded_conf(conf: float, n: int) -> float:
    """The confidence level whose percentile interval is Hesterberg's expanded ``conf``.

    ``1 - 2 Phi(-sqrt(n / (n - 1)) t_{(1 - conf)/2, n - 1})``: wider than ``conf`` for
    small ``n`` (0.9998 at n = 4, 0.989 at 8, 0.972 at 16 for conf = 0.95), and ``conf``
    itself for ``n < 2``, where nothing can be resampled.
    """
    if n < 2:
        return conf
    t = float(sps.t.ppf((1.0 - conf) / 2.0, n - 1))
    tail = float(sps.norm.cdf(math.sqrt(n / (n - 1)) * t))
    return min(1.0 - 2.0 * tail, 1.0 - 1e-12)


def _check(conf: float, n_resamples: int, q: float) -> None:
    if not 0.0 < conf < 1.0:
        raise ValueError(f"conf: expected 0 < conf < 1, got {conf}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples: expected >= 1, got {n_resamples}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: expected 0 <= q <= 1, got {q}")


def bootstrap_quantile(
    values: npt.ArrayLike,
    q: float = 0.5,
    *,
    conf: float = 0.95,
    n_resamples: int = 2000,
    seed: SeedLike = 0,
    expand: bool = False,
) -> Interval:
    """The ``q``-quantile of ``values`` with a percentile bootstrap interval.

    ``values`` is a 1-D sample (each value resampled on its own) or a 2-D units x values
    matrix with NaN padding (whole units resampled: a cluster bootstrap). ``expand``
    widens the interval for the number of units (:func:`expanded_conf`).
    """
    _check(conf, n_resamples, q)
    mat = _units(values)
    flat = _clean(mat)
    if flat.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    estimate = float(np.quantile(flat, q))
    rng = np.random.default_rng(seed)
    (boot,) = _resample_stat([mat], q, n_resamples, rng)
    n = int(mat.shape[0])
    low, high = _percentiles(boot, expanded_conf(conf, n) if expand else conf)
    return Interval(estimate, low, high, n, log_se(boot, n))


def bootstrap_ratio(
    num: npt.ArrayLike,
    den: npt.ArrayLike,
    q: float = 0.5,
    *,
    paired: bool = False,
    conf: float = 0.95,
    n_resamples: int = 2000,
    seed: SeedLike = 0,
    expand: bool = False,
) -> Interval:
    """``quantile(num) / quantile(den)`` with a percentile bootstrap interval.

    Independent (``paired=False``): each sample is resampled on its own; 2-D inputs are
    resampled by unit within their own sample. Paired: ``num`` and ``den`` are aligned by
    unit (row ``i`` of both is the same session), and the same drawn units are used for
    both; rows may be NaN-padded and a unit may be missing (all NaN) on one side.
    ``expand`` widens the interval for the number of units (:func:`expanded_conf`).
    """
    _check(conf, n_resamples, q)
    a = np.asarray(num, dtype=np.float64)
    b = np.asarray(den, dtype=np.float64)
    a2 = a[:, None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    flat_a, flat_b = _clean(a2), _clean(b2)
    if flat_a.size == 0 or flat_b.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    estimate = float(np.quantile(flat_a, q) / np.quantile(flat_b, q))
    rng = np.random.default_rng(seed)
    if paired:
        if a2.shape[0] != b2.shape[0]:
            raise ValueError("paired: num and den must have one row per unit, aligned")
        keep = ~(np.all(~np.isfinite(a2), axis=1) & np.all(~np.isfinite(b2), axis=1))
        a2 = np.where(np.isfinite(a2), a2, np.nan)[keep]
        b2 = np.where(np.isfinite(b2), b2, np.nan)[keep]
        boot_a, boot_b = _resample_stat([a2, b2], q, n_resamples, rng)
        n = int(a2.shape[0])
    else:
        ua, ub = _units(a2), _units(b2)
        (boot_a,) = _resample_stat([ua], q, n_resamples, rng)
        (boot_b,) = _resample_stat([ub], q, n_resamples, rng)
        n = int(min(ua.shape[0], ub.shape[0]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = boot_a / boot_b
    low, high = _percentiles(ratios, expanded_conf(conf, n) if expand else conf)
    return Interval(estimate, low, high, n, log_se(ratios, n))


def t_interval(values: npt.ArrayLike, *, conf: float = 0.95) -> Interval:
    """The mean of ``values`` (NaN dropped) with a Student t interval.

    Fewer than two values give a NaN interval (one value: its own estimate), and
    identical values a zero-width one.
    """
    if not 0.0 < conf < 1.0:
        raise ValueError(f"conf: expected 0 < conf < 1, got {conf}")
    x = _clean(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = float(sps.t.ppf(0.5 + conf / 2.0, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, int(x.size))


def mann_whitney(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    alternative: Literal["two-sided", "b-greater"] = "two-sided",
) -> MannWhitney:
    """Mann-Whitney U test of sample B against sample A (NaN dropped).

    ``alternative="b-greater"`` is the one-sided test "B tends to be larger" (for
    latencies: B slower). Empty samples give NaN.
    """
    xa, xb = _clean(a), _clean(b)
    if xa.size == 0 or xb.size == 0:
        return MannWhitney(math.nan, math.nan, math.nan)
    alt = "greater" if alternative == "b-greater" else "two-sided"
    res = sps.mannwhitneyu(xb, xa, alternative=alt)
    u_b = float(res.statistic)
    return MannWhitney(u_b, float(res.pvalue), u_b / (xa.size * xb.size))


def holm(p_values: npt.ArrayLike) -> Array:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and does not count)."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    m = order.size
    scaled = p[order] * (m - np.arange(m))
    out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out


Decision = Literal["slower", "no change", "faster", "inconclusive"]


def decide_ratio(low: float, high: float, threshold: float) -> Decision:
    """Read a ratio's interval against ``1 +- threshold`` (see the module docstring).

    A NaN bound is "inconclusive". With ``threshold = 0`` "no change" needs a
    zero-width interval at exactly 1.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    if low > 1.0 + threshold:
        return "slower"
    if high < 1.0 - threshold:
        return "faster"
    if low >= 1.0 - threshold and high <= 1.0 + threshold:
        return "no change"
    return "inconclusive"


class BootOptions(TypedDict):
    """The keyword arguments :meth:`Bootstrap.options` gives the bootstrap functions."""

    conf: float
    n_resamples: int
    seed: SeedLike
    expand: bool


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are computed: confidence level, resamples, base seed, expansion.

    ``expand``: intervals that resample sessions use Hesterberg's expanded percentile
    interval (:func:`expanded_conf`), which keeps small session counts near nominal.
    """

    conf: float = 0.95
    n_resamples: int = 2000
    seed: int = 0
    expand: bool = True

    def options(self, seed: SeedLike) -> BootOptions:
        """Keyword arguments of :func:`bootstrap_quantile` and :func:`bootstrap_ratio`."""
        return {
            "conf": self.conf,
            "n_resamples": self.n_resamples,
            "seed": seed,
            "expand": self.expand,
        }

    def method(self) -> str:
        """One sentence naming the method, for reports."""
        kind = "expanded percentile (Hesterberg 2015)" if self.expand else "percentile"
        return (
            f"{self.conf:.0%} {kind} bootstrap intervals, {self.n_resamples} resamples, "
            f"seed {self.seed}"
        )


DEFAULT_BOOTSTRAP = Bootstrap()


def robust_sd(draws: npt.ArrayLike) -> float:
    """SD of bootstrap draws from their 15.9 and 84.1 percentiles (NaN when < 2 finite)."""
    x = _clean(draws)
    if x.size < 2:
        return math.nan
    low, high = np.quantile(x, [sps.norm.cdf(-1.0), sps.norm.cdf(1.0)])
    return float(high - low) / 2.0


def log_se(boot: npt.ArrayLike, n: int) -> float:
    """Standard error of a log statistic from its bootstrap values (module docstring).

    The robust SD of the logs of the positive finite values, times
    :func:`small_sample_factor`; NaN with fewer than 2 units or 2 usable values.
    """
    x = _clean(boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(x[x > 0])
    return robust_sd(logs) * small_sample_factor(n)


def small_sample_factor(n: int) -> float:
    """``sqrt(n / (n - 1))``: how much a bootstrap SE over ``n`` units is too small."""
    return math.sqrt(n / (n - 1)) if n >= 2 else math.nan


def log_quantile_draws(
    mats: Sequence[npt.ArrayLike],
    q: float = 0.5,
    *,
    paired: bool,
    n_resamples: int = 2000,
    seed: SeedLike = 0,
) -> tuple[Array, Array]:
    """Log ``q``-quantile of each matrix, and its bootstrap draws (``n_resamples x k``).

    Each matrix is units x values (NaN padding; ``+inf`` a failed request, counted as
    :data:`FAILED`). ``paired``: every matrix has the same units in the same rows (one
    session seen in several runs), and every draw takes the same units from all of them;
    otherwise each is resampled on its own. A matrix without values gives NaN.
    """
    _check(0.5, n_resamples, q)
    rng = np.random.default_rng(seed)
    prepared = [_failed_as_large(np.asarray(m, dtype=np.float64)) for m in mats]
    point = np.array([_log_quantile(m, q) for m in prepared])
    if paired:
        rows = {m.shape[0] for m in prepared}
        if len(rows) != 1:
            raise ValueError("paired: every matrix must have one row per unit, aligned")
        draws = _resample_stat(prepared, q, n_resamples, rng) if rows != {0} else []
    else:
        draws = [
            _resample_stat([m], q, n_resamples, rng)[0]
            if m.shape[0]
            else np.full(n_resamples, np.nan)
            for m in (_units(m) for m in prepared)
        ]
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.column_stack(draws)) if draws else np.empty((n_resamples, 0))
    return point, np.where(np.isfinite(logs), logs, np.nan)


def _failed_as_large(mat: Array) -> Array:
    mat = mat[:, None] if mat.ndim == 1 else mat
    return np.where(np.isposinf(mat), FAILED, np.where(np.isfinite(mat), mat, np.nan))


def _log_quantile(mat: Array, q: float) -> float:
    flat = _clean(mat)
    if flat.size == 0:
        return math.nan
    value = float(np.quantile(flat, q))
    return math.log(value) if value > 0 else math.nan


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
    x = _clean(diffs)
    plus, minus = int((x > 0).sum()), int((x < 0).sum())
    if plus == 0:
        return 1.0
    return float(sps.binom.sf(plus - 1, plus + minus, 0.5))


def upper_mean_bound(values: npt.ArrayLike, *, conf: float) -> float:
    """One-sided upper ``conf`` bound of a mean (Student t); the value itself when all equal."""
    x = _clean(values)
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
    low = 0.0 if x <= 0 else float(sps.beta.ppf(tail, x, n - x + 1))
    high = 1.0 if x >= n else float(sps.beta.ppf(1.0 - tail, x + 1, n - x))
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
        n_star = n_eff * (float(sps.t.ppf(q, n - 1)) / float(sps.t.ppf(q, k - 1))) ** 2
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
    xb, xa = _clean(b), _clean(a)
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
    x = _clean(values)
    if x.size < 2:
        return 1.0
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if sd == 0:
        return 0.0 if mean > bound else 1.0
    return float(sps.t.sf((mean - bound) / (sd / math.sqrt(x.size)), x.size - 1))
