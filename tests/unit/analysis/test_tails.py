"""Tail percentiles: MLPerf LoadGen's early-stopping estimate, and its sample counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sessiongen.analysis.tails import clustered_tail, min_passing, min_samples, tail


@pytest.mark.parametrize(
    ("p", "needed"), [(0.5, 11), (0.9, 64), (0.95, 130), (0.97, 219), (0.99, 662)]
)
def test_minimum_sample_counts_are_loadgens(p: float, needed: int) -> None:
    # The counts LoadGen's rules publish for confidence 0.99.
    assert min_samples(p) == needed


def test_min_passing_without_failures_is_the_geometric_bound() -> None:
    for p in (0.9, 0.99):
        assert min_passing(0, p) == math.ceil(math.log(0.01) / math.log(p))


def test_too_few_samples_give_no_percentile_and_no_false_bound() -> None:
    # The text said "p90 >= max": false most of the time, the maximum lies above the
    # true p90 only with probability 1 - 0.9^n. It now says n/a, keeping the empirical.
    result = tail(np.arange(1.0, 13.0), 0.9)
    assert not result.enough and math.isnan(result.value)
    assert result.n == 12 and result.needed == 64
    assert result.empirical == 11.0 and result.maximum == 12.0  # nearest rank 11 of 12
    assert result.text() == "n/a (12 of 64 needed; max 12)"


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, -0.1])
def test_p_outside_the_open_unit_interval_is_refused(p: float) -> None:
    # p = 1 looped forever in min_passing.
    with pytest.raises(ValueError, match="0 < p < 1"):
        tail([1.0, 2.0], p)
    with pytest.raises(ValueError, match="0 < p < 1"):
        min_samples(p)


def test_turns_of_one_session_are_not_independent_samples() -> None:
    # 8 sessions x 8 identical turns are 8 samples: pooled as 64, the "p90" was their
    # maximum, which covers the true p90 57% of the time, not 99%.
    rng = np.random.default_rng(3)
    per_session = rng.lognormal(0.0, 0.5, 8)
    values = np.repeat(per_session, 8)
    units = np.repeat(np.arange(8), 8)
    assert tail(values, 0.9).enough  # the independent reading finds "enough"
    clustered = clustered_tail(values, units, 0.9)
    assert not clustered.enough and clustered.n_effective == pytest.approx(8.0)
    assert "8 effective of 64 needed" in clustered.text()


def test_clustered_estimate_covers_the_true_percentile() -> None:
    # 100 sessions of 4 turns, half the variance shared within a session: the estimate
    # on the effective sample covers the true p90 at least as often as promised.
    rng = np.random.default_rng(11)
    true_p90 = float(np.exp(0.5 * 1.2815515655446004))  # lognormal(0, 0.5) overall
    covered = pooled = 0
    for _ in range(300):
        shared = np.repeat(rng.normal(0.0, 0.5 * math.sqrt(0.5), 100), 4)
        own = rng.normal(0.0, 0.5 * math.sqrt(0.5), 400)
        values, units = np.exp(shared + own), np.repeat(np.arange(100), 4)
        covered += clustered_tail(values, units, 0.9).value >= true_p90
        pooled += tail(values, 0.9).value >= true_p90
    assert covered / 300 >= 0.97, (covered, pooled)


def test_independent_units_lose_nothing() -> None:
    rng = np.random.default_rng(5)
    x = rng.lognormal(0.0, 0.5, 400)
    alone, clustered = tail(x, 0.9), clustered_tail(x, np.arange(400), 0.9)
    assert clustered.n_effective == 400 and clustered.bound == alone.bound


def test_the_estimate_is_an_order_statistic_above_the_empirical_percentile() -> None:
    rng = np.random.default_rng(0)
    x = rng.lognormal(0.0, 0.5, 5000)
    result = tail(x, 0.9)
    assert result.enough and result.bound is not None
    assert result.bound >= result.empirical
    assert result.bound in set(x.tolist())
    # Published example: n=5000 lognormal(0, 0.5), empirical p90 1.910, estimate 1.969.
    assert result.empirical == pytest.approx(1.910, abs=0.01)
    assert result.bound == pytest.approx(1.969, abs=0.01)


def test_the_estimate_covers_the_true_percentile_at_least_as_often_as_promised() -> None:
    rng = np.random.default_rng(7)
    true_p90 = float(np.exp(0.5 * 1.2815515655446004))  # lognormal(0, 0.5)
    below = [tail(rng.lognormal(0.0, 0.5, 200), 0.9).value >= true_p90 for _ in range(300)]
    assert np.mean(below) >= 0.97  # promised 0.99; 300 trials


def _binom_search(t: int, p: float, confidence: float) -> int:
    """min_passing's search written on scipy.stats.binom.cdf, its textbook form."""
    from scipy import stats

    def passing(h: int) -> bool:
        return float(stats.binom.cdf(t, h + t, 1.0 - p)) < 1.0 - confidence

    h = 1
    while not passing(h):
        h += 1
    return h


@pytest.mark.parametrize("p", [0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("confidence", [0.95, 0.99])
def test_min_passing_equals_the_search_on_the_binomial_cdf(p: float, confidence: float) -> None:
    # min_passing reads the binomial CDF as scipy.special's incomplete beta (a third of
    # scipy.stats' import time); the smallest passing h must be the same integer
    for t in (0, 1, 2, 3, 7, 20, 61):
        assert min_passing(t, p, confidence) == _binom_search(t, p, confidence), t
