"""Planner against the simulated pair where requests contend, beside two served replays.

    .venv/bin/python bench/plan_agreement.py [SCENARIO] [--set KEY=VALUE ...]

Replays the scenario twice on the simulated pair and plans it once on the virtual
clock, then prints per turn the median of the simulator's own modeled TTFT in each,
the planner's difference from the first replay, and the first replay's from the
second. Without arguments it runs the pressure test's configuration
(tests/integration/test_load_sim.py): 6 sessions of 4k tokens in flight on 2 replicas
whose KV caches hold about two sessions each. The replays state each request's
modeled arrival (sessiongen.replay.modeled), so they should agree with each other and
with the planner however busy the machine is; before they did, the wall clock's
order of nearly simultaneous arrivals made two replays differ by up to 332% per turn.

Prints, asserts nothing. Run without arguments, it writes the worst differences and the
load average to ``docs/data/plan_agreement.json``, which the planning guide quotes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import polars as pl
from _docs import record

from sessiongen import scenario
from sessiongen.capacity.agreement import CELL, per_turn
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.records.run import load_run
from sessiongen.replay.orchestrator import ReplayOptions, replay

ROOT = Path(__file__).resolve().parent.parent
PRESSURE = [
    "sessions.count=6", "sessions.turns=4", "sessions.initial_context_tokens=4096",
    "sessions.answer_tokens=200", "sessions.think_time_s=2", "load.levels=[1, 6]",
    "target.sim.local_cache_tokens=9000", "target.sim.max_model_len=8192",
    "target.sim.time_scale=0.2", "design.warmup_requests=1",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "pressure32k.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=None)
    args = parser.parse_args()
    overrides = args.overrides if args.overrides is not None else PRESSURE
    sc = scenario.load(args.scenario, overrides)
    load = os.getloadavg()[0]
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        served = [
            load_run(replay(sc, ReplayOptions(runs_dir=root / f"s{i}", progress=False)).run_dir)
            for i in range(2)
        ]
        planned = load_run(virtual_replay(sc, root / "plan", tokens="exact"))
    first = per_turn(planned, served[0]).select(*CELL, "planned_s", "served_s", "difference")
    between = per_turn(served[0], served[1]).select(
        *CELL, pl.col("served_s").alias("served_again_s"), pl.col("difference").alias("replays")
    )
    table = first.join(between, on=CELL).sort(CELL)
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=200, float_precision=3):
        print(table)
    figures = {"load": load}
    for name in ("difference", "replays"):
        worst = table[name].abs().quantile(1.0)
        print(f"worst |{name}|: {worst:.1%}" if worst is not None else f"{name}: none")
        if worst is not None:
            figures[f"{'planner' if name == 'difference' else 'served'}.worst"] = worst
    print(f"load average after: {os.getloadavg()}")
    record("plan_agreement", figures, args=args, documented=parser.parse_args([]))


if __name__ == "__main__":
    main()
