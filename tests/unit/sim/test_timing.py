"""The timing terms (``sessiongen/sim/timing.py``) give the same bits run as Python and
compiled into the engine, which includes that file's text; and the hit overhead is
``np.interp``'s interpolation to the bit, in both."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import compiled, timing
from sessiongen.sim.timing import Params

pytestmark = pytest.mark.usefixtures("compiled_engine")

COUNTS = st.integers(-5, 300_000)
SECONDS = st.floats(0.0, 1e4, allow_nan=False)
# a step's duration: none, or one of a microsecond or more (the guess of how many steps
# reach a time must fit a C integer, as it always does for a real run)
DURATIONS = st.just(0.0) | st.floats(1e-6, 1e4)


def _terms() -> dict[str, Callable[..., Any]]:
    core = compiled.core()
    assert core is not None
    terms: dict[str, Callable[..., Any]] = core.timing_terms()
    return terms


def _both(profile: SimProfile) -> tuple[Params, Any]:
    """The profile's numbers as each engine holds them."""
    core = compiled.core()
    assert core is not None
    return Params(profile), core.Params(profile)


def _python(name: str) -> Callable[..., Any]:
    term: Callable[..., Any] = getattr(timing, name)
    return term


PROFILES = st.builds(
    lambda slowdown, prefill, attn, base, ktok, batch, bw, fixed, store: dataclasses.replace(
        SimProfile(),
        slowdown=slowdown,
        prefill_s_per_ktok=prefill,
        attn_s_per_ktok2=attn,
        itl_base_s=base,
        itl_per_ktok_s=ktok,
        itl_per_batch_s=batch,
        pool_bandwidth_gbps=bw,
        pool_load_fixed_s=fixed,
        pool_store_s_per_gb=store,
    ),
    st.floats(0.1, 5.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 0.01),
    st.floats(0.0, 0.1),
    st.floats(0.0, 0.01),
    st.floats(0.0, 0.01),
    st.floats(0.5, 100.0),
    st.floats(0.0, 0.5),
    st.floats(0.0, 5.0),
)


@given(PROFILES, COUNTS, COUNTS, st.booleans())
def test_every_term_is_the_same_bits_in_both_engines(
    profile: SimProfile, a: int, b: int, partial: bool
) -> None:
    p, q = _both(profile)
    native = _terms()
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("prefill_s", (a, abs(b))),
        ("decode_step_s", (a, abs(b))),
        ("pool_store_s", (abs(a),)),
        ("pool_fixed_s", ()),
        ("pool_transfer_s", (abs(a),)),
        ("hit_overhead_s", (a,)),
        ("run_delta", (abs(a), abs(b), partial)),
    ]
    for name, args in calls:
        want, got = _python(name)(p, *args), native[name](q, *args)
        assert got == want and type(want) is float, name


@given(
    SECONDS,
    DURATIONS,
    st.just(0.0) | st.floats(1e-9, 1.0),  # a run's growth: none, or a real one
    st.integers(1, 10**6),
    st.floats(-1.0, 1e5),
)
def test_the_run_arithmetic_is_the_same_in_both_engines(
    start: float, duration: float, delta: float, steps: int, elapsed: float
) -> None:
    native = _terms()
    assert native["boundary"](start, duration, delta, steps) == timing.boundary(
        start, duration, delta, steps
    )
    guess = timing.steps_reaching(duration, delta, elapsed)
    assert native["steps_reaching"](duration, delta, elapsed) == guess
    assert guess >= 1


@settings(max_examples=300)
@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=6, unique=True),
    st.lists(st.floats(0.0, 10.0), min_size=6, max_size=6),
    st.integers(-10, 10**6 + 10),
)
def test_the_hit_overhead_is_numpys_interpolation_to_the_bit(
    xs: list[int], ys: list[float], x: int
) -> None:
    xs = sorted(xs)
    ys = ys[: len(xs)]
    profile = dataclasses.replace(
        SimProfile(), slowdown=1.0, hit_overhead_tokens=tuple(xs), hit_overhead_s=tuple(ys)
    )
    (p, q), native = _both(profile), _terms()["hit_overhead_s"]
    for point in [x, *xs]:
        want = float(np.interp(point, xs, ys)) if point > 0 else 0.0
        assert timing.hit_overhead_s(p, point) == want
        assert native(q, point) == want
