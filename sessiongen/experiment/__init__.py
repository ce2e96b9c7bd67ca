"""The experiment of a block, written once: what a replay and a plan both step through.

Clock-free and I/O-free: it reads a scenario and the sessions the workload built, and
knows neither replay's HTTP nor the planner's engine. Each driver keeps its own clock
and its own way to send: replay's asyncio loop (wall or modeled clock), the planner's
event heap on the simulator's engine.

- :mod:`.warmups`: the warm-up requests of a block, a pure function;
- :mod:`.script`: a block's sessions as a script: slots, start offsets, think times,
  cross-replica marking, queue time, stop on the first failure; events in
  (:meth:`~.script.BlockScript.started`, :meth:`~.script.BlockScript.finished`), sends
  out (:class:`~.script.Send`);
- :mod:`.facts`: a turn's facts, built once by keyword (:class:`~.facts.TurnFacts`),
  which a driver turns into a request record or a planned row;
- :mod:`.head`: the run head (the manifest as a run starts) and a block's entry.
"""
