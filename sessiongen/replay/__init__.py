"""Replay: run a scenario's sessions against a target, block by block, and record it all.

- :mod:`.plan`: which blocks run, in which order (:class:`~.plan.BlockPlan`);
- :mod:`.placement`: which replica serves each turn, where the client picks it;
- :mod:`.routing`: where each turn goes (a replica, or a router) and which replica served it;
- :mod:`.runner`: one block's sessions, turn by turn, into request records;
- :mod:`.workers`: a block's sessions spread over processes (``--workers N``);
- :mod:`.progress`: the console progress of a block;
- :mod:`.orchestrator`: the run: blocks, warm-ups, counters, the run folder (:func:`replay`);
  its plan without running it (:func:`dry_run`).
"""

from sessiongen.replay.orchestrator import ReplayOptions, ReplayResult, dry_run, replay

__all__ = ["ReplayOptions", "ReplayResult", "dry_run", "replay"]
