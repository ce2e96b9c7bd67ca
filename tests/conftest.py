"""Shared fixtures, and the hypothesis profiles.

Property tests are reproducible by default (profile ``ci``: derandomized, no example
database), so CI and a fresh clone run the same examples every time. Random
exploration is for your machine: ``SESSIONGEN_HYPOTHESIS=explore make test-fast``
draws new examples each run (and more of them); a failure it finds becomes an
``@example`` in the test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiohttp.test_utils import TestServer
from hypothesis import settings

from sessiongen.infra import signals
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.server import make_apps

SimServers = Callable[..., Awaitable[list[TestServer]]]

settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("SESSIONGEN_HYPOTHESIS", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """The suite answers Ctrl-C however it was started. A shell starts a background job
    (``make test &`` in a script) with SIGINT ignored, Python then installs no handler,
    and every child the tests start inherits the ignore: the tests that interrupt a
    replay or a pair with SIGINT would wait for it in vain (a fresh clone's run in the
    background failed three of them so). Python's own handler is put back."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def stop_signals_answered() -> None:
    """SIGTERM and SIGHUP at their default during a test that sends them (the suite may
    run under ``nohup``, which ignores SIGHUP, and sessiongen keeps an ignored signal
    ignored); :func:`_signal_handlers_restored` puts the suite's own back after."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """``sessiongen.cli.main`` installs its signal handlers for the rest of the process
    (exit hooks included); a test that calls it in-process gets pytest's back after."""
    saved = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    signals.reset()


@pytest.fixture
def sim_servers(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> SimServers:
    """Factory: in-process simulated replicas on free ports, sharing one pool.

    ``await sim_servers(profile=None, shared_cache=True, model="sim-27b")``; the
    default profile runs 1,000x faster than modeled time.
    """

    async def start(
        profile: SimProfile | None = None, shared_cache: bool = True, model: str = "sim-27b"
    ) -> list[TestServer]:
        apps = make_apps(profile or SimProfile(time_scale=0.001), model, shared_cache)
        return [await aiohttp_server(app) for app in apps]

    return start
