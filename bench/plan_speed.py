"""How fast the planner runs a day of traffic, and what its cost grows with.

    .venv/bin/python bench/plan_speed.py [--hours 1] [--full-day] [--skip-growth]

The day is ``scenarios/day128k.toml``: one new six-turn session a second (Poisson) on
8 replicas, every session asking about one shared 128k-token document, a minute's
think time, 100-token answers, pool on (one block; the scenario's OFF block doubles
it). ``--hours`` plans that many modeled hours (3,600 sessions an hour) and
extrapolates to 24; ``--full-day`` plans all 86,400 sessions. Then how the cost per
request grows with replicas (at the same load per replica), context length and
arrival rate. CPU seconds are the process's own (``time.process_time``, user plus
system), steadier than wall time on a shared machine; the load average is printed
beside them. System time is mostly first touches of fresh memory (page faults), so it
is printed apart: it falls as the planner keeps less.

Prints, asserts nothing: the figures depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import polars as pl

from sessiongen import scenario
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.records.run import load_run

DAY = Path(__file__).resolve().parent.parent / "scenarios" / "day128k.toml"


def plan_once(overrides: list[str]) -> tuple[float, float, int, pl.DataFrame]:
    """(CPU s, wall s, requests, measured rows) of one planned block."""
    sc = scenario.load(DAY, ['design.blocks=["on"]', *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        cpu, wall = time.process_time(), time.monotonic()
        run_dir = virtual_replay(sc, Path(tmp), tokens="shape")
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        ok = load_run(run_dir).ok
    return cpu, wall, ok.height, ok


def describe(label: str, cpu: float, wall: float, requests: int) -> str:
    per = cpu / max(requests, 1) * 1e6
    return (
        f"{label:<44} {requests:>8,} requests  {cpu:7.1f} s CPU  {wall:7.1f} s wall  "
        f"{per:6.0f} us CPU/request"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--full-day", action="store_true")
    parser.add_argument("--skip-growth", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    hours = 24.0 if args.full_day else args.hours
    sessions = int(3600 * hours)
    cpu, wall, n, ok = plan_once([f"sessions.count={sessions}"])
    print(describe(f"day128k, {hours:g} modeled h, 8 replicas", cpu, wall, n))
    ttft = ok["ttft_s"].quantile(0.5), ok["ttft_s"].quantile(0.9)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"  modeled TTFT p50 {ttft[0]:.3f} s, p90 {ttft[1]:.3f} s; peak memory "
        f"{usage.ru_maxrss / 1024:.0f} MB; the process so far {usage.ru_utime:.1f} s user + "
        f"{usage.ru_stime:.1f} s system ({usage.ru_minflt:,} page faults)"
    )
    if not args.full_day:
        print(f"  a day (24 h) at this rate: {cpu * 24 / hours:.0f} s CPU per block")
    if not args.skip_growth:
        print("cost per request as the day grows (10 modeled minutes each):")
        base = ["sessions.count=600"]
        for replicas in (2, 4, 8, 16):
            rate = replicas / 8  # the same load per replica
            cpu, wall, n, _ = plan_once(
                [*base, f"target.sim.replicas={replicas}", f"load.levels=[{rate}]"]
            )
            print(describe(f"  {replicas} replicas, {rate:g} sessions/s", cpu, wall, n))
        for document in (8192, 32768, 131072):
            cpu, wall, n, _ = plan_once([*base, f"sessions.shared_prefix_tokens={document}"])
            print(describe(f"  shared document of {document} tokens", cpu, wall, n))
        cpu, wall, n, _ = plan_once(
            [*base, "sessions.shared_prefix_tokens=0", "sessions.initial_context_tokens=32768",
             "load.levels=[0.05]"]
        )  # fmt: skip
        print(describe("  unique 32k contexts, 0.05 sessions/s", cpu, wall, n))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
