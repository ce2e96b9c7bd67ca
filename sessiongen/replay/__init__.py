"""Replay: run a scenario's sessions against a target, block by block, and record it all.

The run's design (its blocks, arrivals, think times and client placements) is
:mod:`sessiongen.design`'s and the block script it steps through (slots, warm-ups, the
run head) :mod:`sessiongen.experiment`'s, both shared with the planner; a block's console
progress is :mod:`sessiongen.infra.progress`; what a finished replay comes to (summary,
verdicts, exit status) is :mod:`sessiongen.outcome`'s, above this stage.

- :mod:`.routing`: where each turn goes (a replica, or a router) and which replica served it;
- :mod:`.runner`: one block's sessions, turn by turn, into request records;
- :mod:`.modeled`: on one simulated engine, each request states its modeled arrival, so
  that a replay reproduces itself however busy the machine is;
- :mod:`.workers`: a block's sessions spread over processes (``--workers N``);
- :mod:`.armcheck`: a block whose replicas say at start they are in the other arm is
  stopped before it is sent;
- :mod:`.orchestrator`: the run: blocks, warm-ups, counters, the run folder (:func:`replay`);
  its plan without running it (:func:`dry_run`).
"""

from sessiongen.replay.orchestrator import ReplayOptions, ReplayResult, dry_run, replay

__all__ = ["ReplayOptions", "ReplayResult", "dry_run", "replay"]
