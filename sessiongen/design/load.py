"""The load of a block: its levels, and how many sessions may be in flight at once.

A closed loop keeps its level's sessions in flight (``load.levels``, else
``driver.concurrency``). An open loop starts sessions on a schedule and caps them at
``load.max_in_flight``: a synthetic open loop's level is its start rate; a trace's
schedule is its own timestamps, so a trace block has no level at all (None, a null
``load_level`` in its records), never a default nobody used.
"""

from __future__ import annotations

from sessiongen.scenario.spec import Scenario


def open_loop(scenario: Scenario) -> bool:
    """Sessions start on a schedule: an open-loop load, or a trace's timestamps."""
    return scenario.load.arrival != "closed" or scenario.sessions.source == "trace"


def load_levels(scenario: Scenario) -> tuple[float | None, ...]:
    """The load levels a run sweeps: ``load.levels``, else ``driver.concurrency``; a
    trace's one level None (its timestamps are its load)."""
    if scenario.sessions.source == "trace":
        return (None,)
    return scenario.load.levels or (float(scenario.driver.concurrency),)


def concurrency(scenario: Scenario, level: float | None) -> int:
    """Sessions in flight at most at ``level``: the closed loop's level, or the open
    loop's cap."""
    if open_loop(scenario) or level is None:
        return scenario.load.max_in_flight
    return int(level)


def in_flight(scenario: Scenario, level: float | None, sessions: int) -> int:
    """Sessions a block can have in flight at once (connections worth opening ahead)."""
    return max(1, min(concurrency(scenario, level), sessions))
