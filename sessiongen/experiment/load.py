"""The concurrency rule: how many sessions of a block may be in flight at once.

A closed loop keeps its level's sessions in flight (``load.levels``, else
``driver.concurrency``). An open loop starts sessions on a schedule (``load.arrival``, or a
trace's own timestamps) and caps them at ``load.max_in_flight``; its level is a start
rate, or nothing at all for a trace (whose schedule is its own).
"""

from __future__ import annotations

from sessiongen.scenario.spec import Scenario


def open_loop(scenario: Scenario) -> bool:
    """Sessions start on a schedule: an open-loop load, or a trace's timestamps."""
    return scenario.load.arrival != "closed" or scenario.sessions.source == "trace"


def concurrency(scenario: Scenario, level: float | None) -> int:
    """Sessions in flight at most at ``level``: the closed loop's level, or the open
    loop's cap."""
    if open_loop(scenario) or level is None:
        return scenario.load.max_in_flight
    return int(level)


def in_flight(scenario: Scenario, level: float | None, sessions: int) -> int:
    """Sessions a block can have in flight at once (connections worth opening ahead)."""
    return max(1, min(concurrency(scenario, level), sessions))
