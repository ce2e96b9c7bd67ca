"""How much faster a what-if grid plans when its configurations run in parallel.

    .venv/bin/python bench/plan_sweep.py [--jobs N] [--ray] [--scenario S] [--vary K=V,...]
                                            [--set K=V]

Plans one grid (default: ``scenarios/load128k.toml`` at one load level,
replicas 2, 4, 8 by pool sizes 16, 64, 256 GiB: nine configurations) one after another
(``--jobs 1``), then over ``--jobs`` processes (default: the cores this process may use),
and with ``--ray`` as Ray tasks on a local instance of as many CPUs (its start-up timed
apart). Prints each wall time, the speed-up over one job, and whether the what-if and
turn tables are identical to the sequential ones (they should be, whatever the executor).

Prints, asserts nothing: the figures depend on the machine and on what else runs on it
(the 1-minute load average is printed beside each; CPU seconds are this process's and
its workers'). The speed-up is bounded by the cores left over by everything else, by
the slowest configuration (a grid whose configurations differ in size waits for the
largest) and by each worker's start-up (importing the engine, about 2 s here).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sessiongen.capacity.sweep import SweepOptions, default_jobs

if TYPE_CHECKING:
    import polars as pl

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "load128k.toml"
VARY = ["target.sim.replicas=2,4,8", "target.sim.pool_capacity_gib=16,64,256"]
SETS = ["load.levels=[0.02]"]


def cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (a local
    sweep's workers, joined when it ends; not Ray's, which are the raylet's)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(
    args: argparse.Namespace, sweep: SweepOptions
) -> tuple[float, float, pl.DataFrame, pl.DataFrame]:
    """(wall s, CPU s, what-if table, turn table) of one plan of the grid."""
    # Imported here, not at the top: a spawned worker re-imports this script (its
    # __main__), and the planner's report stack costs it 8 s to import on this machine.
    import polars as pl

    from sessiongen.analysis.whatif import Vary
    from sessiongen.capacity.plan import plan

    with tempfile.TemporaryDirectory() as tmp:
        start, cpu = time.perf_counter(), cpu_s()
        out = plan(
            args.scenario,
            overrides=args.set,
            varies=[Vary.parse(v) for v in args.vary],
            runs_dir=Path(tmp),
            sweep=sweep,
        )
        wall, cpu = time.perf_counter() - start, cpu_s() - cpu
        return (
            wall,
            cpu,
            pl.read_parquet(out / "whatif.parquet"),
            pl.read_parquet(out / "turns.parquet"),
        )


def load() -> str:
    """The 1-minute load average: what else ran meanwhile."""
    return f"{os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--vary", action="append", help=f"default: {' '.join(VARY)}")
    parser.add_argument("--set", action="append", help=f"default: {' '.join(SETS)}")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--ray", action="store_true", help="also time Ray on a local instance")
    args = parser.parse_args()
    args.vary = args.vary or VARY
    args.set = args.set if args.set is not None else SETS
    configs = 1
    for v in args.vary:
        configs *= len(v.partition("=")[2].split(","))
    print(
        f"{args.scenario.name}, {configs} configurations: {' x '.join(args.vary)}; set {args.set}"
    )
    print(f"cores usable: {default_jobs()}, os.cpu_count(): {os.cpu_count()}")
    print(f"load average before: {os.getloadavg()}")
    base, cpu, whatif, turns = timed(args, SweepOptions(jobs=1))
    print(f"  --jobs 1           {base:7.1f} s wall  {cpu:6.1f} s CPU  load {load()}")
    wall, cpu, w, t = timed(args, SweepOptions(jobs=args.jobs))
    same = w.equals(whatif) and t.equals(turns)
    print(f"  --jobs {args.jobs:<11} {wall:7.1f} s wall  {cpu:6.1f} s CPU  load {load()}  "
          f"speed-up {base / wall:4.2f}x  tables identical: {same}")  # fmt: skip
    if args.ray:
        import ray

        start = time.perf_counter()
        ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False)
        up = time.perf_counter() - start
        try:
            wall, _cpu, w, t = timed(args, SweepOptions(executor="ray"))
        finally:
            ray.shutdown()
        same = w.equals(whatif) and t.equals(turns)
        print(f"  --executor ray     {wall:7.1f} s wall  (CPU in Ray's workers)  load {load()}  "
              f"speed-up {base / wall:4.2f}x  tables identical: {same}  "
              f"(Ray start-up {up:.1f} s apart)")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
