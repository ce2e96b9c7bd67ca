"""Step detection on seeded noisy series whose truth is planted."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sessiongen.trend import stepdetect as sd

NOISE = 0.05  # 5% per night, on the log scale


def _series(seed: int, n: int, steps: dict[int, float], noise: float = NOISE) -> np.ndarray:
    """log(2 s) plus noise, multiplied by ``factor`` from each planted position on."""
    rng = np.random.default_rng([n, seed])
    y = math.log(2.0) + rng.normal(0.0, noise, n)
    for at, factor in steps.items():
        y[at:] += math.log(factor)
    return y


def _sigma(n: int, noise: float = NOISE) -> np.ndarray:
    return np.full(n, noise)


@pytest.mark.parametrize(
    ("n", "steps"),
    [
        (20, {12: 1.3}),  # a 30% slowdown, 8 nights ago
        (20, {17: 1.4}),  # a 40% slowdown, 3 nights ago
        (24, {8: 0.7, 16: 1.5}),  # an improvement, then a regression
    ],
)
def test_planted_large_steps_are_found_at_the_right_night(n: int, steps: dict[int, float]) -> None:
    for seed in range(40):
        fit = sd.fit_steps(_series(seed, n, steps), _sigma(n))
        assert fit.steps == sorted(steps), (seed, fit.steps)


def test_planted_moderate_step_is_usually_found_exactly() -> None:
    # 20% = 3.6 sigma, 6 nights at the new level: power is high but not certain.
    exact = sum(
        sd.fit_steps(_series(s, 24, {18: 1.2}), _sigma(24)).steps == [18] for s in range(100)
    )
    assert exact >= 85, exact


def test_levels_and_latest_shift_match_the_plant() -> None:
    fit = sd.fit_steps(_series(3, 20, {14: 1.3}), _sigma(20))
    shift = sd.latest_shift(fit)
    assert shift is not None and shift.at == 14 and shift.nights == 6
    assert math.exp(shift.before) == pytest.approx(2.0, rel=0.05)
    assert math.exp(shift.after - shift.before) == pytest.approx(1.3, rel=0.06)
    fitted = fit.fitted()
    assert fitted.shape == (20,) and np.all(fitted[:14] == shift.before)


def test_a_step_on_the_newest_night_alone_is_dated_right_and_not_yet_persistent() -> None:
    # With segments of >= 2 nights the fit lends the new level the night before; that
    # night is neither counted nor taken as the start.
    for seed in range(30):
        fit = sd.fit_steps(_series(seed, 12, {11: 1.5}), _sigma(12))
        shift = sd.latest_shift(fit)
        assert shift is None or (shift.at == 11 and shift.nights == 1), (seed, shift)
        fit = sd.fit_steps(_series(seed, 13, {11: 1.5}), _sigma(13))
        shift = sd.latest_shift(fit)
        assert shift is not None and (shift.at, shift.nights) == (11, 2), (seed, shift)


def test_no_change_on_flat_series_with_5_percent_noise() -> None:
    # 200 deterministic seeds. The default penalty (3 log n) was chosen so that no flat
    # series of 6 to 30 nights got a change in 4,500 seeded trials; at that rate, more
    # than 1 in 200 here would mean the method changed, not bad luck.
    changed = [
        (n, seed)
        for n in (8, 30)
        for seed in range(100)
        if len(sd.fit_steps(_series(seed, n, {}), _sigma(n)).segments) > 1
    ]
    assert len(changed) <= 1, changed


def test_noise_beyond_the_intervals_is_added_as_night_noise() -> None:
    # Intervals that see half the noise (night-to-night noise the bootstrap cannot see):
    # tau makes up the rest, sqrt(0.05**2 - 0.025**2) = 0.043, and false changes stay rare.
    n = 20
    changed = sum(
        len(sd.fit_steps(_series(seed, n, {}), _sigma(n, NOISE / 2)).segments) > 1
        for seed in range(200)
    )
    unscaled = sum(
        len(sd.fit_steps(_series(seed, n, {}), _sigma(n, NOISE / 2), penalty=1.0).segments) > 1
        for seed in range(20)
    )
    assert changed <= 4, changed
    assert unscaled >= 10  # the same data does split when the penalty is tiny
    point = [sd.night_noise(_series(s, n, {}), _sigma(n, NOISE / 2), upper=None) for s in range(80)]
    assert float(np.median(point)) == pytest.approx(math.sqrt(0.05**2 - 0.025**2), rel=0.15)
    bound = [sd.night_noise(_series(s, n, {}), _sigma(n, NOISE / 2)) for s in range(80)]
    assert all(b >= p for b, p in zip(bound, point, strict=True))


def test_honest_intervals_need_no_night_noise() -> None:
    taus = np.array([sd.night_noise(_series(s, 40, {}), _sigma(40), upper=None) for s in range(60)])
    assert (taus == 0).sum() >= 20  # the intervals explain the noise ...
    assert math.hypot(NOISE, float(np.median(taus))) < 1.1 * NOISE  # ... up to estimation


def test_pooling_estimates_night_noise_that_one_short_series_cannot() -> None:
    # 50 series of 7 nights whose intervals see 40% of a 5% noise: tau = 0.046.
    truth = math.sqrt(0.05**2 - 0.02**2)
    series = [(_series(s, 7, {}), _sigma(7, 0.02)) for s in range(50)]
    own = [sd.night_noise(y, sig, upper=None) for y, sig in series]
    assert sum(o < 0.7 * truth for o in own) >= 5  # one series often looks quiet
    pooled = sd.pooled_night_noise(series, upper=None)
    assert pooled == pytest.approx(truth, rel=0.15)


def test_zero_width_intervals_do_not_disable_detection() -> None:
    # One sample per night gives zero-width intervals. The old scale, floored at 1 on
    # sigmas of 1, made every level the same; the night noise from the data finds steps.
    n = 20
    zeros = np.zeros(n)
    for seed in range(20):
        assert sd.fit_steps(_series(seed, n, {12: 1.3}), zeros).steps == [12], seed
        mixed = _sigma(n)
        mixed[::3] = 0.0  # some nights with a zero-width interval
        assert sd.fit_steps(_series(seed, n, {12: 1.3}), mixed).steps == [12], seed
    flat = sum(len(sd.fit_steps(_series(s, n, {}), zeros).segments) > 1 for s in range(100))
    assert flat <= 2, flat


def test_a_prior_sets_the_least_night_noise() -> None:
    y, sig = _series(4, 20, {}), _sigma(20, NOISE / 2)
    own = sd.fit_steps(y, sig).night_noise
    assert sd.fit_steps(y, sig, night_noise_prior=0.0).night_noise == own
    assert sd.fit_steps(y, sig, night_noise_prior=3 * own).night_noise == 3 * own


def test_single_outliers_do_not_make_steps() -> None:
    for seed in range(50):
        y = _series(seed, 16, {})
        y[7] += math.log(3.0)  # one wild night mid-series
        assert len(sd.fit_steps(y, _sigma(16)).segments) == 1, seed
        y = _series(seed, 16, {})
        y[-1] += math.log(3.0)  # the newest night alone: not (yet) a level
        assert len(sd.fit_steps(y, _sigma(16)).segments) == 1, seed


def test_an_outlier_next_to_a_step_does_not_move_it() -> None:
    for seed in range(30):
        y = _series(seed, 20, {12: 1.4})
        y[11] -= math.log(2.0)
        assert sd.fit_steps(y, _sigma(20)).steps == [12], seed


def test_gaps_are_skipped_and_positions_index_the_input() -> None:
    for seed in range(30):
        y = _series(seed, 24, {14: 1.35})
        y[[3, 9, 14, 15]] = np.nan  # missing nights, including the first at the new level
        fit = sd.fit_steps(y, _sigma(24))
        assert fit.steps == [16], (seed, fit.steps)
        assert sum(seg.n for seg in fit.segments) == 20
        assert fit.segments[-1].end == 24 and fit.segments[0].start == 0


def test_points_with_wide_intervals_weigh_less() -> None:
    n = 14
    y = _series(1, n, {11: 1.3})
    tight = sd.fit_steps(y, _sigma(n))
    sigma = _sigma(n)
    sigma[11:] = 1.0  # the new nights are hardly measured at all
    loose = sd.fit_steps(y, sigma)
    assert tight.steps == [11] and loose.steps == []


def test_without_intervals_the_data_scale_is_used() -> None:
    y = np.exp(_series(2, 20, {10: 1.25}))
    fit = sd.fit_steps(y)  # raw values, no sigma
    assert fit.steps == [10]
    assert sd.fit_steps(np.full(10, 3.0)).steps == []
    assert sd.fit_steps([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]).steps == [4]


def test_short_and_empty_series() -> None:
    assert sd.fit_steps([]).segments == ()
    assert sd.fit_steps([np.nan, np.nan]).segments == ()
    fit = sd.fit_steps([1.0, 5.0, 9.0], [0.01, 0.01, 0.01])  # too short to split
    assert len(fit.segments) == 1 and sd.latest_shift(fit) is None
    with pytest.raises(ValueError, match="min_size"):
        sd.fit_steps([1.0, 2.0], min_size=0)


def test_sigma_from_ci() -> None:
    z = 1.959963984540054
    sigma = sd.sigma_from_ci([1.0, 2.0, np.nan, 3.0], [math.e, 2.0, 1.0, 2.0])
    assert sigma[0] == pytest.approx(1 / (2 * z))
    assert sigma[1] == 0.0 and np.isnan(sigma[2]) and np.isnan(sigma[3])
    assert sd.sigma_from_ci([1.0], [3.0], log=False)[0] == pytest.approx(1 / z)


def _objective(y: np.ndarray, sig: np.ndarray, bounds: list[int], beta: float) -> float:
    starts = np.asarray(bounds[:-1], dtype=np.int64)
    cost = sum(
        float(sd._segment_costs(y, sig, starts[i : i + 1], b, sd.HUBER_C)[0])
        for i, b in enumerate(bounds[1:])
    )
    return cost + beta * (len(bounds) - 2)


def test_pruned_dynamic_program_is_exact() -> None:
    # Brute force over every segmentation with segments of >= 2 points.
    n, beta, min_size = 10, 2.0, 2
    for seed in range(25):
        rng = np.random.default_rng(seed)
        y = rng.normal(0, 1, n) + np.repeat(rng.normal(0, 2, 3), [3, 4, 3])
        y[rng.integers(n)] += 8.0
        sig = rng.uniform(0.5, 1.5, n)
        found = sd._partition(y, sig, beta, min_size, sd.HUBER_C)
        best = math.inf
        for k in range(n):
            for cuts in itertools.combinations(range(min_size, n - min_size + 1), k):
                bounds = [0, *cuts, n]
                if all(b - a >= min_size for a, b in itertools.pairwise(bounds)):
                    best = min(best, _objective(y, sig, bounds, beta))
        assert _objective(y, sig, found, beta) == pytest.approx(best, abs=1e-6), seed
