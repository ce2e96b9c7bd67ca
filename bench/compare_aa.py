"""Benchmark: how often ``compare`` calls identical runs slower, and how often it finds a
real slowdown. Prints only.

    .venv/bin/python bench/compare_aa.py [--reps 100] [--quick] [--sweep]

Synthetic runs with known truth (tests/support/synthetic.py): run B replays run A's
scenario (same sessions, new request noise) with every cell carrying a run effect of its
own (lognormal, SD ``run effect``: host, clock, restart luck), times a planted slowdown.
Two shapes: smoke-like (8 sessions, 1 placement, 6 turns: 12 cells) and alt32k-like (8
sessions, 2 placements, 6 turns: 24 cells), request noise 2% and session spread 10%
(cells' intervals about +-2%, as on the simulated pair). For each, with one run a side
(the default, 4% run noise assumed) and with three runs a side (run noise estimated),
the share of comparisons that exit 1 (slower), 0 (no change or faster) and 3
(inconclusive). A false-alarm rate is the exit-1 share at slowdown 1.00; power, the exit-1
share at a real slowdown. Fixed seeds: the same figures on every machine. With 100 reps
a rate near 5% is known to about +-2 points.

Noise above compare's level (``compare.NOISE_LEVEL``): identical runs at 6% and 8% run
effect per cell, and *loud cells*: three runs a side at a 3% run effect where a quarter
of the cells carry 8% or 13% (the CPU pair's round-to-round movement) of their own, which
the noise pooled over cells understates. ``--sweep`` prints the false-alarm rate of one
run a side (assumed 4%) at 4-8%, the figures behind ``NOISE_LEVEL``.

Run with the defaults it writes its figures to ``docs/data/compare_aa.json``, with
``--sweep`` alone to ``docs/data/compare_aa_sweep.json`` (the Run nightly page quotes both).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _docs import record

from sessiongen import analysis
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

SHAPES = {
    "smoke-like": SyntheticSpec(
        sessions=8, turns=6, placements=("alternate",), noise_sigma=0.02, session_sigma=0.1
    ),
    "alt32k-like": SyntheticSpec(sessions=8, turns=6, noise_sigma=0.02, session_sigma=0.1),
}


def _side(
    root: Path, spec: SyntheticSpec, seed: int, first: int, runs: int, slowdown: float
) -> list[analysis.Run]:
    return [
        analysis.load_run(
            write_run(
                root,
                with_changes(spec, seed=seed, noise_seed=first + i, slowdown=slowdown),
                run_id=f"r{seed}-{first + i}-{slowdown}",
            )
        )
        for i in range(runs)
    ]


def loud(run: analysis.Run, sigma: float, seed: int) -> analysis.Run:
    """``run`` with every fourth cell (by turn: turns 1 and 5 of the OFF arm, 3 of ON...)
    carrying an extra run effect of its own, lognormal SD ``sigma`` (seeded per run)."""
    keys = ["placement", "cache", "context_tokens", "turn"]
    cells = run.requests.select(keys).unique().sort(keys)
    rng = np.random.default_rng(seed)
    factor = np.where(
        np.arange(cells.height) % 4 == 0, rng.lognormal(0.0, sigma, cells.height), 1.0
    )
    cells = cells.with_columns(_f=pl.Series(factor))
    requests = run.requests.join(cells, on=keys).with_columns(pl.col("ttft_s") * pl.col("_f"))
    return dataclasses.replace(run, requests=requests.drop("_f"))


def rates(
    spec: SyntheticSpec,
    run_sigma: float,
    slowdown: float,
    runs: int,
    reps: int,
    loud_sigma: float = 0.0,
) -> dict[int, float]:
    """Share of exit codes over ``reps`` seeded comparisons; ``loud_sigma``: a quarter
    of the cells get that much run effect on top (:func:`loud`)."""
    spec = with_changes(spec, run_sigma=run_sigma)
    codes = {0: 0, 1: 0, 3: 0}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(reps):
            root = Path(tmp) / str(seed)
            side_a = _side(root, spec, seed, 1000, runs, 1.0)
            side_b = _side(root, spec, seed, 2000, runs, slowdown)
            if loud_sigma:
                side_a = [loud(r, loud_sigma, seed * 100 + i) for i, r in enumerate(side_a)]
                side_b = [loud(r, loud_sigma, seed * 100 + 50 + i) for i, r in enumerate(side_b)]
            codes[analysis.compare_runs(side_a, side_b).exit_code] += 1
    return {k: v / reps for k, v in codes.items()}


#: The figures printed so far, under ``SHAPE.RUNSrun.EFFECT.SLOWDOWN.exitCODE``
#: (``smoke.1run.3pct.1.20.exit1``): what :func:`_docs.record` writes.
FIGURES: dict[str, float] = {}


def _effect(run_sigma: float, loud_sigma: float = 0.0) -> tuple[str, str]:
    """A run effect as printed (``3%, 13%``) and as named in a key (``3pct_loud13pct``)."""
    loud = (f", {loud_sigma:.0%}", f"_loud{loud_sigma * 100:.0f}pct") if loud_sigma else ("", "")
    return f"{run_sigma:.0%}{loud[0]}", f"{run_sigma * 100:.0f}pct{loud[1]}"


def _row(
    label: str, runs: int, effect: tuple[str, str], slowdown: float, r: dict[int, float]
) -> None:
    key = f"{label.removesuffix('-like')}.{runs}run.{effect[1]}.{slowdown:.2f}"
    for code, share in r.items():
        FIGURES[f"{key}.exit{code}"] = share
    print(
        f"{label:<12} {runs:>9} {effect[0]:>10} {slowdown:>8.2f}  "
        f"{r[1]:>6.0%} {r[0]:>6.0%} {r[3]:>6.0%}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="one shape, fewer cases")
    parser.add_argument(
        "--sweep", action="store_true", help="only: one run a side, false alarms at 4-8%% noise"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    if args.sweep:
        print(f"compare: false alarms of one run a side over {args.reps} seeded A/A pairs")
        for name, spec in SHAPES.items():
            for sigma in (0.04, 0.05, 0.06, 0.07, 0.08):
                _row(name, 1, _effect(sigma), 1.0, rates(spec, sigma, 1.0, 1, args.reps))
        print(f"({time.perf_counter() - started:.0f} s)")
        sweep = parser.parse_args(["--sweep"])
        record("compare_aa_sweep", FIGURES | _settings(args), args=args, documented=sweep)
        return
    cases = [(0.0, 1.0), (0.03, 1.0), (0.05, 1.0), (0.03, 1.1), (0.03, 1.2), (0.03, 1.3)]
    cases += [(0.06, 1.0), (0.08, 1.0)]
    shapes = dict(list(SHAPES.items())[:1]) if args.quick else SHAPES
    print(f"compare: exit-code shares over {args.reps} seeded pairs per case")
    print(
        f"{'shape':<12} {'runs/side':>9} {'run effect':>10} {'slowdown':>8}  "
        f"{'exit 1':>6} {'exit 0':>6} {'exit 3':>6}"
    )
    for name, spec in shapes.items():
        for runs in (1, 3):
            for run_sigma, slowdown in cases:
                if args.quick and runs == 3 and slowdown not in (1.0,):
                    continue
                r = rates(spec, run_sigma, slowdown, runs, args.reps)
                _row(name, runs, _effect(run_sigma), slowdown, r)
        for extra in (0.08, 0.13):
            for slowdown in (1.0, 1.2):
                r = rates(spec, 0.03, slowdown, 3, args.reps, loud_sigma=extra)
                _row(name, 3, _effect(0.03, extra), slowdown, r)
    print(f"({time.perf_counter() - started:.0f} s)")
    record("compare_aa", FIGURES | _settings(args), args=args, documented=parser.parse_args([]))


def _settings(args: argparse.Namespace) -> dict[str, float]:
    """What every pair shares: the seeded pairs per case, the sessions and the request noise."""
    spec = SHAPES["smoke-like"]
    return {
        "settings.reps": args.reps,
        "settings.sessions": spec.sessions,
        "settings.request_noise": spec.noise_sigma,
    }


if __name__ == "__main__":
    main()
