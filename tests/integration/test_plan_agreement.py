"""One engine, two clocks: the planner agrees with a replay on the simulated pair.

Each shipped scenario that runs on the simulator is replayed on the served simulator
(made smaller and faster: fewer sessions, a small time scale) and planned on the
virtual clock; per turn, the median of the simulator's own modeled TTFT must agree
within 2%. The scenarios are run where their requests do not contend (one session at
a time; open-loop arrivals too sparse to overlap): under contention the served
replay's order of nearly simultaneous arrivals follows the wall clock, so two served
replays differ from each other there (bench/plan_agreement.py measures how much).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.analysis import load_run
from sessiongen.capacity import agreement
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.replay.orchestrator import ReplayOptions, replay
from tests.support.paths import ROOT

#: Per-turn agreement asked of the planner (issue 15).
TOLERANCE = 0.02

FAST = ["target.sim.time_scale=0.05", "design.warmup_requests=1", "driver.concurrency=1"]
CASES = {
    "smoke": [],
    "alt32k": ["sessions.count=2"],
    "fixed32k": ["sessions.count=2", "sessions.turns=4"],
    "alt128k": ["sessions.count=1", "sessions.turns=4", "sessions.probe=\"none\""],
    "fixed128k": ["sessions.count=1", "sessions.turns=3"],
    "xreplica": ["sessions.count=1", "sessions.initial_context_tokens=[8192, 65536]"],
    "pressure32k": ["sessions.count=2", "sessions.turns=3", "load.levels=[1]"],
    "load128k": [
        "sessions.count=2", "sessions.turns=3", "sessions.initial_context_tokens=32768",
        "load.levels=[0.002]", "target.sim.time_scale=0.01",
    ],
    "router128k": [
        "sessions.count=1", "sessions.turns=3", "sessions.initial_context_tokens=32768",
        'placement.policies=["alternate", "router:round_robin", "router:cache_aware"]',
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_planner_agrees_with_the_served_simulator(name: str, tmp_path: Path) -> None:
    if name == "router128k" and importlib.util.find_spec("vllm_router") is None:
        pytest.skip("vllm-router not installed (make router)")
    sc = scenario.load(ROOT / "scenarios" / f"{name}.toml", [*FAST, *CASES[name]])
    served = load_run(replay(sc, ReplayOptions(runs_dir=tmp_path, progress=False)).run_dir)
    planned = load_run(virtual_replay(sc, tmp_path / "plan", tokens="exact"))
    assert served.ok.height == planned.ok.height == served.requests.height
    table = agreement.per_turn(planned, served)
    assert table["planned_s"].null_count() == table["served_s"].null_count() == 0
    worst = table.sort(pl.col("difference").abs(), descending=True).row(0, named=True)
    assert abs(worst["difference"]) <= TOLERANCE, worst
