"""Targets: where a replay's requests go, one block at a time.

- :mod:`.base`: the :class:`Target` protocol, everything replay needs from a target;
- :mod:`.sim`: the embedded simulated replicas (a model, not a real server);
- :mod:`.endpoints`: existing replicas the user names, all in one cache arm;
- :mod:`.pairs`: two pairs of existing replicas, one per cache arm (OFF pair, ON pair);
- :mod:`.switched`: one pair of existing replicas, its arm set by the user's command
  before every block;
- :mod:`.managed`: real vLLM + LMCache replicas that sessiongen starts and stops;
- :mod:`.router`: the router in front of any of them (a vllm-router per ``router:POLICY``
  block, or the user's gateway), which each target holds;
- :mod:`.make`: :func:`make_target`, which of them a replay uses.
"""

from sessiongen.targets.base import Target
from sessiongen.targets.make import make_target

__all__ = ["Target", "make_target"]
