"""Session start schedules and think times, now in :mod:`sessiongen.workload.arrivals`.

They moved below replay so the workload's trace export (and the planner) can use them
without importing the served replay; this name stays for the modules that import it.
"""

from __future__ import annotations

from sessiongen.workload.arrivals import arrival_offsets, think_times

__all__ = ["arrival_offsets", "think_times"]
