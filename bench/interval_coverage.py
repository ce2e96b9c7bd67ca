"""Benchmark: coverage of the analysis's intervals at the shipped session counts. Prints only.

    .venv/bin/python bench/interval_coverage.py [--reps 2000] [--counts 2 3 4 5 6 8 16 32]

For each model of per-session variation in tests/support/coverage.py (the hit/miss
mixture included) and each session count, simulates ``reps`` cells of an OFF, ON, ON,
OFF run with known truth and prints how often each interval holds it:

- the paired speedup interval (median OFF / median ON), plain percentile and expanded
  (Hesterberg 2015, what the analysis uses), at 95% (the report) and 90% (``compare``);
- the expanded 95% interval of the speedup at p90 (p90 OFF / p90 ON; not reported);
- the expanded 95% interval of each arm's p90 TTFT, sessions as units (the report's
  per-turn p90 columns, :func:`sessiongen.analysis.latency.arm_turn_table`).

Then, per session count, the lowest and highest coverage over the models of the
report's two kinds of 95% interval: what sessiongen/analysis/adequacy.py cites. Run with
the defaults, it writes them (and the plain percentile's) to ``docs/data/interval_coverage.json``,
which the Statistics page quotes. With
2,000 reps a coverage near 95% is known to +-1 point (one standard error 0.5 point), near
70% to +-2. Fixed seeds: the same figures on every machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _docs import record

from tests.support.coverage import MODELS, coverage, true_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--counts", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8, 16, 32])
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"coverage of the intervals, {args.reps} simulated cells each (speedup = median ratio)")
    print(
        f"{'model':<16} {'truth':>6} {'n':>3}  {'95% plain':>9} {'95% exp':>8} {'90% exp':>8}"
        f" {'p90 spd':>8} {'p90 OFF':>8} {'p90 ON':>8}"
    )
    speedups: dict[int, list[float]] = {n: [] for n in args.counts}
    p90s: dict[int, list[float]] = {n: [] for n in args.counts}
    plains: dict[int, list[float]] = {n: [] for n in args.counts}
    for model in MODELS:
        truth = true_value(model)
        for n in args.counts:
            plain = coverage(model, n, reps=args.reps, expand=False)
            expanded = coverage(model, n, reps=args.reps)
            ninety = coverage(model, n, reps=args.reps, conf=0.90)
            p90_speedup = coverage(model, n, reps=args.reps, q=0.9)
            p90_off = coverage(model, n, reps=args.reps, q=0.9, of="off")
            p90_on = coverage(model, n, reps=args.reps, q=0.9, of="on")
            speedups[n].append(expanded)
            plains[n].append(plain)
            p90s[n] += [p90_off, p90_on]
            print(
                f"{model.name:<16} {truth:6.3f} {n:3d}  {plain:9.1%} {expanded:8.1%} {ninety:8.1%}"
                f" {p90_speedup:8.1%} {p90_off:8.1%} {p90_on:8.1%}",
                flush=True,
            )
    print("\nper session count, lowest and highest over the models (95%, expanded):")
    print(f"{'n':>3}  {'speedup':>13}  {'arm p90 TTFT':>13}")
    for n in args.counts:
        s, p = speedups[n], p90s[n]
        print(f"{n:3d}  {min(s):6.1%}-{max(s):6.1%}  {min(p):6.1%}-{max(p):6.1%}")
    print(f"({time.perf_counter() - started:.0f} s)")
    figures = {
        f"n{n}.{kind}.{end}": bound(values[n])
        for n in args.counts
        for kind, values in (("speedup", speedups), ("plain", plains), ("arm_p90", p90s))
        for end, bound in (("low", min), ("high", max))
    }
    record("interval_coverage", figures, args=args, documented=parser.parse_args([]))


if __name__ == "__main__":
    main()
