"""Targets: where a replay's requests go, one block at a time.

- :mod:`.base`: the :class:`~.base.Target` protocol, the simulated pair and given endpoints;
- :mod:`.managed`: real vLLM + LMCache replicas that sessiongen starts and stops.
"""
