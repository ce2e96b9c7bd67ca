"""Arrival and think-time schedules: their means and shapes, and that they are seeded."""

from __future__ import annotations

import numpy as np
import pytest

from sessiongen.design.arrivals import arrival_offsets, think_times
from sessiongen.scenario.spec import LoadSpec, SessionsSpec


def gaps(load: LoadSpec, rate: float, n: int = 20_000) -> np.ndarray:
    return np.diff(arrival_offsets(load, rate, n, seed=1))


def test_poisson_gaps_are_exponential_with_the_rate() -> None:
    g = gaps(LoadSpec(arrival="poisson", levels=(2.0,)), 2.0)
    assert g.mean() == pytest.approx(0.5, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.05)  # CV 1


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_keep_the_mean_and_set_the_spread(burstiness: float) -> None:
    g = gaps(LoadSpec(arrival="gamma", levels=(0.5,), burstiness=burstiness), 0.5)
    assert g.mean() == pytest.approx(2.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.08)


def test_constant_and_closed_schedules() -> None:
    assert arrival_offsets(LoadSpec(arrival="constant", levels=(4.0,)), 4.0, 4, 0) == [
        0.0,
        0.25,
        0.5,
        0.75,
    ]
    assert arrival_offsets(LoadSpec(), 1.0, 3, 0) == [0.0, 0.0, 0.0]


def test_schedules_are_seeded_and_differ_by_level() -> None:
    load = LoadSpec(arrival="poisson", levels=(1.0, 2.0))
    assert arrival_offsets(load, 1.0, 50, 3) == arrival_offsets(load, 1.0, 50, 3)
    assert arrival_offsets(load, 1.0, 50, 3) != arrival_offsets(load, 1.0, 50, 4)
    assert arrival_offsets(load, 1.0, 50, 3) != arrival_offsets(load, 2.0, 50, 3)


@pytest.mark.parametrize("kind", ["fixed", "exponential", "lognormal"])
def test_think_times_have_the_mean_and_none_before_turn_one(kind: str) -> None:
    spec = SessionsSpec(turns=6, think_time_s=30.0, think=kind)  # type: ignore[arg-type]
    pauses = [think_times(spec, s, seed=5) for s in range(4000)]
    assert all(p[0] == 0.0 and len(p) == 6 for p in pauses)
    later = np.array([p[1:] for p in pauses])
    assert later.mean() == pytest.approx(30.0, rel=0.03)
    if kind == "fixed":
        assert (later == 30.0).all()
    assert think_times(spec, 7, seed=5) == think_times(spec, 7, seed=5)
    assert think_times(SessionsSpec(turns=3), 0, seed=5) == [0.0, 0.0, 0.0]
