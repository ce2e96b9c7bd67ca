"""Tail percentiles: MLPerf LoadGen's early-stopping estimate, and its sample counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sessiongen.analysis.tails import min_passing, min_samples, tail


@pytest.mark.parametrize(
    ("p", "needed"), [(0.5, 11), (0.9, 64), (0.95, 130), (0.97, 219), (0.99, 662)]
)
def test_minimum_sample_counts_are_loadgens(p: float, needed: int) -> None:
    # The counts LoadGen's rules publish for confidence 0.99.
    assert min_samples(p) == needed


def test_min_passing_without_failures_is_the_geometric_bound() -> None:
    for p in (0.9, 0.99):
        assert min_passing(0, p) == math.ceil(math.log(0.01) / math.log(p))


def test_too_few_samples_give_no_percentile_only_a_lower_bound() -> None:
    result = tail(np.arange(1.0, 13.0), 0.9)
    assert not result.enough and math.isnan(result.value)
    assert result.n == 12 and result.needed == 64 and result.empirical == 12.0
    assert result.text() == ">= 12 (n=12 of 64 needed)"


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
