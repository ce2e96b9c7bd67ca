"""The design of a run: which blocks run, when each session starts, where each turn goes.

What a replay on real or simulated replicas and a plan on the virtual clock both follow,
so that the two run the same experiment; it lies below both (it reads a scenario and
knows neither of them):

- :mod:`.blocks`: which blocks run, in which order, on which cache arm and load level
  (:class:`~.blocks.BlockPlan`, :func:`~.blocks.plan_blocks`);
- :mod:`.load`: the load levels, and the concurrency rule (closed loop: the level; open
  loop and traces: the cap on sessions in flight; a trace has no level);
- :mod:`.arrivals`: when sessions start and how long people pause between turns, seeded;
- :mod:`.placement`: which replica serves each turn where the client picks it.
"""
