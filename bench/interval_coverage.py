"""Benchmark: coverage of the speedup interval at the shipped session counts. Prints only.

    .venv/bin/python bench/interval_coverage.py [--reps 2000] [--counts 2 4 5 6 8 16]

For each model of per-session variation in tests/support/coverage.py and each session
count, simulates ``reps`` cells of an OFF, ON, ON, OFF run with known truth and prints
how often the paired bootstrap interval of the speedup holds it: the plain percentile
interval and the expanded one the analysis uses (Hesterberg 2015), at 95% (the report)
and 90% (``compare``). With 2,000 reps a coverage near 95% is known to +-1 point (one
standard error 0.5 point). Fixed seeds: the same figures on every machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.coverage import MODELS, coverage, true_speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--counts", type=int, nargs="+", default=[2, 4, 5, 6, 8, 16])
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"coverage of the paired speedup interval, {args.reps} simulated cells each")
    print(f"{'model':<16} {'truth':>6} {'n':>3}  {'95% plain':>9} {'95% exp':>8} {'90% exp':>8}")
    for model in MODELS:
        truth = true_speedup(model)
        for n in args.counts:
            plain = coverage(model, n, reps=args.reps, expand=False)
            expanded = coverage(model, n, reps=args.reps)
            ninety = coverage(model, n, reps=args.reps, conf=0.90)
            print(
                f"{model.name:<16} {truth:6.3f} {n:3d}  {plain:9.1%} {expanded:8.1%} {ninety:8.1%}"
            )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
