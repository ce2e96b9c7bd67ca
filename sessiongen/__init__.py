"""sessiongen: measure when a shared KV cache between LLM replicas pays off.

The front door, what the CLI, the notebook and the nightly job call::

    from sessiongen import ReplayOptions, load_run, load_scenario, run_replay, write_report

    scenario = load_scenario("scenarios/alt128k.toml", ["sessions.count=8"])
    result = run_replay(scenario, ReplayOptions())
    write_report(result.run_dir)
    run = load_run(result.run_dir)  # then sessiongen.analysis on it

The package follows the data, one subpackage per stage (each ``__init__`` has a map)::

    scenario (TOML) -> workload (sessions) -> replay -> client -> targets
            |                                   |            (sim | endpoints | managed,
         design (blocks, arrivals, placement)   |             each behind a router or not)
                                         records (Parquet + manifest)
                                                |
                        analysis (polars) -> report (plots) -> trend (nightly)

``design`` (blocks, arrivals, placements) and ``experiment`` (the block script, clock-free,
that both drivers step through) are what replay and the planner (``capacity``: the
simulator's engine on a virtual clock, beside replay, never importing it) both follow;
``outcome`` (what a finished replay comes to: summary, verdicts, exit status) sits above
replay, analysis and report, beside the CLI; ``text`` (tokenizers, the
needle probes' phrasing) is what the workload and the simulator both read, so ``sim``
imports no workload. ``infra`` (files,
processes, ports, console progress), ``sim`` (the simulated replicas), ``launch`` (real
replicas) and ``calibrate`` (the client's own overhead) sit beside them. Errors are in
:mod:`sessiongen.errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sessiongen._version import __version__
from sessiongen.errors import (
    CacheFailureError,
    EndpointError,
    MissingDependencyError,
    OutputError,
    RunDirError,
    RunFailedError,
    ScenarioError,
    SessiongenError,
    UserError,
)

if TYPE_CHECKING:
    from sessiongen.records.run import load_run
    from sessiongen.replay import ReplayOptions
    from sessiongen.replay import replay as run_replay
    from sessiongen.report import write_report
    from sessiongen.scenario import load as load_scenario

__all__ = [
    "CacheFailureError",
    "EndpointError",
    "MissingDependencyError",
    "OutputError",
    "ReplayOptions",
    "RunDirError",
    "RunFailedError",
    "ScenarioError",
    "SessiongenError",
    "UserError",
    "__version__",
    "load_run",
    "load_scenario",
    "run_replay",
    "write_report",
]

# Loaded on first use: every process that imports any part of sessiongen imports this
# file first (the simulator's child process, replay's workers), and the replay and
# report stacks cost 1 to 2 s to import.
_LAZY = {
    "load_scenario": ("sessiongen.scenario", "load"),
    "run_replay": ("sessiongen.replay", "replay"),
    "ReplayOptions": ("sessiongen.replay", "ReplayOptions"),
    "load_run": ("sessiongen.records.run", "load_run"),
    "write_report": ("sessiongen.report", "write_report"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'sessiongen' has no attribute {name!r}")
