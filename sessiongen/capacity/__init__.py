"""Capacity planning: fit the simulator to real runs, then ask what-if in virtual time.

- :mod:`.fit`: ``sessiongen fit``: the timing profile from real runs' records, with
  bootstrap intervals, what the runs leave unidentified, and residuals, written as a
  profile file a scenario can load (its names in use come from there);
- :mod:`.fitted`: the fitted profile (:class:`~.fitted.Fit`): values, intervals, joint
  draws, and the keys and constants the fit and its file share;
- :mod:`.fitdata`: the requests a fit stands on (those that ran alone, from run folders)
  as arrays, and what the manifests tell it (KV size, hardware);
- :mod:`.fitstats`: how far requests stray from a fit: residuals, measurement error,
  the service-time noise;
- :mod:`.fitprofile`: a fit written out: the profile TOML and its plain-text summary;
- :mod:`.estimate`: the fit's numerics on arrays (design, IRLS, identification, the
  stratified two-stage bootstrap), pure and seeded;
- :mod:`.virtual`: a scenario replayed on the simulator's virtual clock (the served
  simulator's engine, no HTTP), written as a run folder of target kind ``plan``; its
  blocks, arrivals and placements are :mod:`sessiongen.design`'s, as replay's are; it
  drives :mod:`sessiongen.experiment`'s block script on an event heap;
- :mod:`.prompts`: the planner's prompts, exact or by shape, prepared once per plan;
- :mod:`.rows`: a planned run's request records as rows of what varies per request
  and facts per block, written with ``requests.parquet``'s schema;
- :mod:`.routers`: models of vllm-router's policies for routed placements;
- :mod:`.grid`: the configurations that ``--vary`` options give (the options, the
  configurations and the what-if columns are :mod:`sessiongen.analysis.whatif`'s);
- :mod:`.sweep`: a grid's independent configurations spread over this machine's cores
  (a process pool) or a Ray cluster, results in grid order whatever finishes first;
- :mod:`.plan`: ``sessiongen plan``: runs the grid (``--seeds`` replicates of each
  configuration), writes the what-if table, per-turn Parquet and the report;
- :mod:`.evidence`: what a verdict rests on (the profile, fitted or not; the model error);
- :mod:`.uncertainty`: a planned gain's interval with sampling, parameter draws and model
  error combined, identical replicates counted once;
- :mod:`.modelerror`: the model's error per regime, shipped and from held-out runs;
- :mod:`.sensitivity`: each verdict at both ends of every profile parameter's box;
- :mod:`.decision`: the plan's side of the pool decision: replicates (seeds, the
  profile's bootstrap draws) and the bisection; the verdicts and the reduction of a
  run's records to what-if rows are :mod:`sessiongen.analysis.payoff`'s, one reading for
  plans and replays;
- :mod:`.find`: ``sessiongen plan --find KEY=LOW:HIGH``: where each cell's verdict flips;
- :mod:`.agreement`: a plan against a replay of the same scenario, per turn.

Nothing here imports :mod:`sessiongen.replay` (``tests/unit/test_layers.py``): the
planner runs beside the served replay, not on top of it. It imports the report stage
to write its own report; the report stage never imports it.
"""
