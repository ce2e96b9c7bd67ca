"""Replay: run a scenario's sessions against a target, block by block, and record it all.

- :mod:`.placement`: which replica serves each turn;
- :mod:`.runner`: one block's sessions, turn by turn, into request records;
- :mod:`.workers`: a block's sessions spread over processes (``--workers N``);
- :mod:`.orchestrator`: the run: blocks, warm-ups, counters, progress, the run folder.
"""

from sessiongen.replay.orchestrator import Outcome, ReplayOptions, make_target, replay

__all__ = ["Outcome", "ReplayOptions", "make_target", "replay"]
