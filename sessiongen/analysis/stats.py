"""Pure, seeded statistics for latency samples: bootstrap intervals and rank tests (tests and
one-sided bounds on log ratios, means and rates: :mod:`.hypotheses`).

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
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np
import numpy.typing as npt

from sessiongen.infra.lazy import lazy_module

if TYPE_CHECKING:
    from scipy import special as spc
    from scipy import stats as sps
else:
    spc = lazy_module("scipy.special")
    sps = lazy_module("scipy.stats")

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


def finite(values: npt.ArrayLike) -> Array:
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
    quantile of the drawn values, without copying or partitioning them (2000
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
    # scipy.special's stdtrit and ndtr, the functions t.ppf and norm.cdf call (the same
    # floats; scipy.stats takes three times as long to import, and a plan needs no more)
    t = float(spc.stdtrit(n - 1, (1.0 - conf) / 2.0))
    tail = float(spc.ndtr(math.sqrt(n / (n - 1)) * t))
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
    flat = finite(mat)
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
    flat_a, flat_b = finite(a2), finite(b2)
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
    x = finite(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = (
        float(spc.stdtrit(x.size - 1, 0.5 + conf / 2.0)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    )
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
    xa, xb = finite(a), finite(b)
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
    x = finite(draws)
    if x.size < 2:
        return math.nan
    low, high = np.quantile(x, [spc.ndtr(-1.0), spc.ndtr(1.0)])
    return float(high - low) / 2.0


def log_se(boot: npt.ArrayLike, n: int) -> float:
    """Standard error of a log statistic from its bootstrap values (module docstring).

    The robust SD of the logs of the positive finite values, times
    :func:`small_sample_factor`; NaN with fewer than 2 units or 2 usable values.
    """
    x = finite(boot)
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
    flat = finite(mat)
    if flat.size == 0:
        return math.nan
    value = float(np.quantile(flat, q))
    return math.log(value) if value > 0 else math.nan
