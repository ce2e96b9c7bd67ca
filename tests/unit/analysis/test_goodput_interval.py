"""The goodput interval (hypotheses.clustered_share): Clopper-Pearson on the effective sample
size (Korn & Graubard 1998). All good reads at the top, never below 99% good; the lower
end rises with the good turns; a nominal 95% interval covers clustered binomial data."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiongen.analysis import hypotheses


def test_clopper_pearson_matches_the_textbook_values() -> None:
    low, high = hypotheses.clopper_pearson(9, 10)
    assert round(low, 4) == 0.555 and round(high, 4) == 0.9975  # Clopper & Pearson 1934
    assert hypotheses.clopper_pearson(10, 10) == (0.025 ** (1 / 10), 1.0)
    assert hypotheses.clopper_pearson(0, 10)[0] == 0.0


def test_all_good_sits_at_the_top_and_above_99_percent() -> None:
    # The bug report: 16 sessions of 8 turns, all good, read 1.00 [0.80, 1.00] while one
    # bad turn (99.2%) read [0.94, 1.00]: the all-good interval must not be the less sure.
    turns = np.full(16, 8)
    good = hypotheses.clustered_share(turns, turns)
    one_bad = hypotheses.clustered_share(np.r_[7, np.full(15, 8)], turns)
    assert good.share == 1.0 and good.high == 1.0
    assert good.low > one_bad.low > 0.94
    assert good.low > 0.96  # (0.025)^(1/n*), n* = 128 (t_127 / t_15)^2
    assert good.n_effective == 128


@st.composite
def _sessions(draw: st.DrawFn) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    k = draw(st.integers(2, 40))
    turns = np.array(draw(st.lists(st.integers(1, 12), min_size=k, max_size=k)))
    good = np.array([draw(st.integers(0, int(m))) for m in turns])
    return good, turns


@settings(max_examples=400, derandomize=True, deadline=None)
@given(_sessions())
def test_all_good_is_never_less_sure_than_any_sample_of_the_same_sessions(
    sample: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
) -> None:
    good, turns = sample
    top = hypotheses.clustered_share(turns, turns)
    other = hypotheses.clustered_share(good, turns)
    assert top.high == 1.0
    assert top.low >= other.low


def _layout(sessions: int, turns: int, bad: int, *, whole: bool) -> npt.NDArray[np.int64]:
    """Good turns per session with ``bad`` bad turns: one per session in turn (spread),
    or filling whole sessions first."""
    good = np.full(sessions, turns)
    for j in range(bad):
        good[j // turns if whole else j % sessions] -= 1
    return good


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.integers(2, 40), st.integers(1, 12), st.booleans())
def test_interval_rises_with_the_good_turns(sessions: int, turns: int, whole: bool) -> None:
    # Spread: every bad turn in a session of its own (while sessions last); whole: bad
    # sessions are entirely bad (the design effect is then (n - 1) / (k - 1) throughout).
    sizes = np.full(sessions, turns)
    step = turns if whole else 1
    shares = [
        hypotheses.clustered_share(_layout(sessions, turns, bad, whole=whole), sizes)
        for bad in range(sessions * turns, -1, -step)
    ]
    lows, highs = np.array([s.low for s in shares]), np.array([s.high for s in shares])
    assert (np.diff(lows) >= -1e-12).all(), lows
    assert (np.diff(highs) >= -1e-12).all(), highs


def test_design_effect_can_still_lower_the_bound_between_layouts() -> None:
    # What the method does not promise (hypothesis found it): one more good turn in a
    # session already above the mean spreads the sessions apart, the design effect
    # rises, and the lower end falls. Monotone along a layout, not in every session.
    before = hypotheses.clustered_share([1, 2, 3, 3, 3], np.full(5, 3))
    after = hypotheses.clustered_share([1, 3, 3, 3, 3], np.full(5, 3))
    assert after.share > before.share and after.design_effect > before.design_effect


def _coverage(truth: float, concentration: float, sessions: int, turns: int, reps: int) -> float:
    rng = np.random.default_rng(20240531)
    a, b = truth * concentration, (1 - truth) * concentration
    covered = 0
    for _ in range(reps):
        good = rng.binomial(turns, rng.beta(a, b, size=sessions))
        share = hypotheses.clustered_share(good, np.full(sessions, turns))
        covered += share.low <= truth <= share.high
    return covered / reps


def test_coverage_of_clustered_binomial_data() -> None:
    # Beta-binomial sessions (each session its own good probability, mean `truth`): a
    # strong clustering (concentration 2, intraclass correlation 1/3) and a mild one
    # (concentration 20, 0.05), at goodput levels an objective asks for.
    got = {
        (truth, conc, k): _coverage(truth, conc, k, 6, 400)
        for truth in (0.8, 0.95)
        for conc in (2.0, 20.0)
        for k in (8, 30)
    }
    assert min(got.values()) >= 0.90, got


def test_clopper_pearson_and_the_clustered_share_equal_scipy_stats_quantiles() -> None:
    # hypotheses reads beta.ppf and t.ppf as the scipy.special functions they call
    # (betaincinv, stdtrit): the same floats, without importing scipy.stats
    from scipy import stats

    rng = np.random.default_rng(7)
    tail = (1.0 - 0.95) / 2.0  # as clopper_pearson computes it (not the literal 0.025)
    for x, n in zip(rng.uniform(0.1, 400, 50), rng.uniform(401, 900, 50), strict=True):
        low, high = hypotheses.clopper_pearson(x, n)
        assert low == float(stats.beta.ppf(tail, x, n - x + 1))
        assert high == float(stats.beta.ppf(1.0 - tail, x + 1, n - x))
    trials = rng.integers(1, 9, 30).astype(float)
    good = np.minimum(trials, rng.integers(0, 9, 30)).astype(float)
    share = hypotheses.clustered_share(good, trials)
    n, k = float(trials.sum()), trials.size
    ratio = float(stats.t.ppf(0.975, n - 1)) / float(stats.t.ppf(0.975, k - 1))
    n_star = share.n_effective * ratio**2  # as clustered_share computes it
    expected = hypotheses.clopper_pearson(share.share * n_star, n_star)
    assert (share.low, share.high) == expected
