"""Statistics on seeded synthetic data with known truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sessiongen.analysis import hypotheses, stats

TRUE_MEDIAN = 2.0  # lognormal(mu=ln 2, sigma) has median exactly 2


def _sample(seed: int, n: int, sigma: float = 0.6) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(math.log(TRUE_MEDIAN), sigma, n)


def test_median_ci_coverage_is_near_nominal() -> None:
    covered = 0
    for seed in range(200):
        ci = stats.bootstrap_quantile(_sample(seed, 60), conf=0.95, seed=seed)
        covered += ci.low <= TRUE_MEDIAN <= ci.high
    assert 180 <= covered <= 198, covered


def test_narrower_conf_gives_lower_coverage_and_narrower_interval() -> None:
    x = _sample(7, 80)
    wide = stats.bootstrap_quantile(x, conf=0.95, seed=1)
    narrow = stats.bootstrap_quantile(x, conf=0.5, seed=1)
    assert wide.low < narrow.low <= narrow.estimate <= narrow.high < wide.high


def test_bootstrap_is_deterministic_per_seed() -> None:
    x = _sample(3, 50)
    assert stats.bootstrap_quantile(x, seed=5) == stats.bootstrap_quantile(x, seed=5)
    assert stats.bootstrap_quantile(x, seed=5) != stats.bootstrap_quantile(x, seed=6)


def test_p90_estimate_and_interval() -> None:
    x = np.arange(1.0, 1001.0)
    ci = stats.bootstrap_quantile(x, q=0.9, seed=0)
    assert ci.estimate == pytest.approx(np.quantile(x, 0.9))
    assert ci.low < 900.1 < ci.high


def test_degenerate_samples() -> None:
    empty = stats.bootstrap_quantile([])
    assert math.isnan(empty.estimate) and empty.n == 0
    one = stats.bootstrap_quantile([3.0, math.nan])
    assert (one.estimate, one.low, one.high, one.n) == (3.0, 3.0, 3.0, 1)
    assert math.isnan(stats.bootstrap_ratio([], [1.0]).estimate)
    with pytest.raises(ValueError):
        stats.bootstrap_quantile([1.0], conf=1.5)


def _sessions(seed: int, n: int, speedup: float) -> tuple[np.ndarray, np.ndarray]:
    """OFF and ON TTFT for n sessions with a strong per-session effect shared by both."""
    rng = np.random.default_rng(seed)
    session = rng.lognormal(0.0, 0.5, n)
    off = 8.0 * session * rng.lognormal(0.0, 0.05, n)
    on = 8.0 / speedup * session * rng.lognormal(0.0, 0.05, n)
    return off, on


def test_ratio_recovers_planted_speedup_and_covers_it() -> None:
    covered = 0
    for seed in range(100):
        off, on = _sessions(seed, 40, 3.0)
        ci = stats.bootstrap_ratio(off, on, paired=True, n_resamples=500, seed=seed)
        covered += ci.low <= 3.0 <= ci.high
    assert 88 <= covered <= 100, covered
    off, on = _sessions(0, 200, 3.0)
    assert stats.bootstrap_ratio(off, on, paired=True).estimate == pytest.approx(3.0, rel=0.1)


def test_pairing_removes_session_variation() -> None:
    off, on = _sessions(11, 40, 2.0)
    paired = stats.bootstrap_ratio(off, on, paired=True, seed=0)
    independent = stats.bootstrap_ratio(off, on, paired=False, seed=0)
    assert paired.estimate == independent.estimate
    assert (paired.high - paired.low) < 0.5 * (independent.high - independent.low)


def test_paired_units_with_missing_values() -> None:
    off, on = _sessions(2, 30, 2.0)
    off2 = np.column_stack([off, off * 1.01])
    on2 = np.column_stack([on, on * 0.99])
    on2[0, :] = np.nan  # a session that failed in the ON arm
    on2[1, 1] = np.nan
    ci = stats.bootstrap_ratio(off2, on2, paired=True, seed=0)
    assert ci.n == 30 and ci.low < 2.0 < ci.high
    with pytest.raises(ValueError):
        stats.bootstrap_ratio(off2, on2[:-1], paired=True)


def test_mann_whitney_false_positive_rate_and_power() -> None:
    rejections = 0
    for seed in range(200):
        rejections += stats.mann_whitney(_sample(seed, 30), _sample(seed + 1000, 30)).p_value < 0.05
    assert rejections <= 20, rejections
    a, b = _sample(1, 30), _sample(2, 30) * 1.5
    res = stats.mann_whitney(a, b, alternative="b-greater")
    assert res.p_value < 0.01 and res.prob_b_greater > 0.65
    assert stats.mann_whitney(b, a, alternative="b-greater").p_value > 0.5


def test_holm_adjustment() -> None:
    adj = stats.holm([0.01, 0.04, math.nan, 0.03])
    assert adj[0] == pytest.approx(0.03)
    assert adj[1] == pytest.approx(0.06) and adj[3] == pytest.approx(0.06)
    assert math.isnan(adj[2])


def test_stable_seed_depends_on_key_only() -> None:
    assert stats.stable_seed(0, "alternate", 3) == stats.stable_seed(0, "alternate", 3)
    assert stats.stable_seed(0, "alternate", 3) != stats.stable_seed(0, "fixed", 3)


def test_rate_exceeds_takes_each_column_as_a_sample() -> None:
    # scipy's boschloo_exact reads columns as the two samples; rows gave 0.049 here.
    assert hypotheses.rate_exceeds(2, 50, 0, 130) == pytest.approx(0.0566, abs=5e-4)
    assert hypotheses.rate_exceeds(3, 50, 0, 130) < 0.05 < hypotheses.rate_exceeds(2, 50, 0, 130)
    assert (
        hypotheses.rate_exceeds(0, 50, 3, 130) == 1.0
        and hypotheses.rate_exceeds(5, 0, 0, 10) == 1.0
    )
    # Fisher's, for large tables, agrees in direction.
    assert (
        hypotheses.rate_exceeds(30, 1000, 5, 1000)
        < 1e-4
        < hypotheses.rate_exceeds(5, 1000, 30, 1000)
    )


def test_rate_exceeds_holds_its_level() -> None:
    # Exact size: the largest rejection probability over the common rate, 12 vs 24 trials.
    from scipy.stats import binom

    reject = [
        (k1, k0)
        for k1 in range(13)
        for k0 in range(25)
        if hypotheses.rate_exceeds(k1, 12, k0, 24) < 0.05
    ]
    size = max(
        sum(binom.pmf(k1, 12, p) * binom.pmf(k0, 24, p) for k1, k0 in reject)
        for p in [i / 50 for i in range(1, 50)]
    )
    assert size <= 0.05


def test_quantiles_from_scipy_special_equal_scipy_stats() -> None:
    # expanded_conf, t_interval and robust_sd call stdtrit and ndtr, the functions
    # scipy.stats' t.ppf and norm.cdf call, so a plan never imports scipy.stats
    from scipy import stats as sps

    for n in range(2, 300):
        t = float(sps.t.ppf((1.0 - 0.95) / 2.0, n - 1))
        want = min(1.0 - 2.0 * float(sps.norm.cdf(math.sqrt(n / (n - 1)) * t)), 1.0 - 1e-12)
        assert stats.expanded_conf(0.95, n) == want
    x = np.random.default_rng(4).lognormal(0.0, 0.5, 40)
    half = float(sps.t.ppf(0.975, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    interval = stats.t_interval(x)
    assert (interval.low, interval.high) == (float(x.mean()) - half, float(x.mean()) + half)
    low, high = np.quantile(x, [sps.norm.cdf(-1.0), sps.norm.cdf(1.0)])
    assert stats.robust_sd(x) == float(high - low) / 2.0
