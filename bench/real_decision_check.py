"""The real-stack tier's former pool-decision test, by hand: planned verdicts against the real pair.

    .venv/bin/python bench/real_decision_check.py [--out DIR] [--seeds 3] [--pays-at 1.1]

Moved out of tests/realstack/test_plan_real.py (the tier's time), check for
check: what ``test_the_planned_pool_decision_holds_on_the_real_pair`` asserted, this
script asserts, and it exits 1 naming what failed (0 when all held). Its many runs (the
probe twice per arm, both arms of the decision, a plan of three replicates) took about as
long as the rest of the tier's requests together. The tier keeps the part that only
needs one pass: a fit on both arms of the probe tells the pool's store cost apart
(``test_a_fit_on_both_arms_tells_the_store_cost_apart``); the fuller study, at two KV
sizes and with the 3k cells, is bench/heldout_decision.py (it asserts nothing).

The pool decision held out at one KV size (the pair's, which holds every cell's working set):
scenarios/decision-cpu.toml's 12k sessions (5 a cell) at 1, 2 and 4 in flight, placements
alternate and fixed; the ON arm on a pool-ON pair (dev mode, so the replicas tell their
structure), then that pair stopped and the OFF arm on a pair without the connector, the
two merged; fitprobe on each pair before and after its arm's decision blocks (two passes,
each pass's arms merged and fitted together, so that the fit has both arms' cold
requests, tells the store cost apart, and its intervals hold the machine's drift between
a run's phases); the plan of the same cells with that fit (``--seeds`` replicates: seeds
and the fit's bootstrap draws); per cell the session and later-turn gains' errors and
whether the verdicts against ``--pays-at`` agree (:mod:`sessiongen.capacity.heldout`).

Checks (the test's, unchanged):

- the fit resampled over the two passes, and the store cost is a column of its design
  (not held at 0 for want of the pool-off arm);
- every cell in both (placements x levels), every session complete in both arms, each
  plan replicate's sessions;
- each verdict reads its own interval (pays: low >= pays-at; does not pay: high < it);
- per level, the median over cells of |planned / measured - 1| of the session gain within
  :data:`DECISION_BOUNDS`;
- at one in flight, where the measured contrast (alternate / fixed session gain) is at
  least :data:`CLEAR`, the planned one reaches :data:`CONTRAST_SHARE` of it in log terms.

Two pair starts (1.5 to 3 minutes each on 2 cores) and about 2 minutes per arm's decision
blocks beside a busy machine. The figures it gave as a tier test are in the README ("The
decision held out on the real pair"): store cost 26.6 s/GB [10.9, 43.8] (one pass) and
11.0 [0.7, 19.1] (two) on a quiet dev machine, at its bound 0 beside a CPU hog; measured
placement contrast 1.45 and 1.84 against planned 1.29 and 1.32 (load 3, 2026-12-03).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from sessiongen import replay, scenario
from sessiongen.analysis import structure
from sessiongen.capacity import fit, heldout, plan
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.tinymodel import kv_bytes_per_token
from sessiongen.records.io import read_meta
from sessiongen.records.merge import merge_runs
from sessiongen.records.run import load_run

ROOT = Path(__file__).resolve().parent.parent
DECISION = ROOT / "scenarios" / "decision-cpu.toml"
PROBE = ROOT / "scenarios" / "fitprobe.toml"
#: decision-cpu's 12k sessions only (its 3k cells, where the pool cannot pay on this
#: pair, are in bench/heldout_decision.py), 5 per cell, the fewest a verdict needs.
DECISION_SETS = ["sessions.initial_context_tokens=[12000]", "sessions.count=5"]
#: Bound on the median over a level's cells of |planned / measured - 1| of the session
#: gain. Measured (bench/heldout_decision.py, both arms fitted, load average 3-5 on 2
#: cores): 13-14% per 12k cell at one session in flight, 16-54% at two and 47-52% at
#: four. At one in flight the model holds; at two and four a cell's gain turns on which
#: of its six sessions' turns queue behind another's 12k prefill on the same replica, a
#: matter of timing (the fit's service-time noise gives the plan that spread: 16-30% at
#: the median, 2026-12-04, against 29-59% without it; 12-41% against 21-38% on a second
#: run that day), so there the bound only catches a broken plan.
DECISION_BOUNDS = {1.0: 0.35, 2.0: 0.8, 4.0: 0.8}
#: What the pool decision turns on: alternate placement gains more from the pool than
#: fixed. At one in flight, where the measured contrast is at least CLEAR, the planned
#: one must reach at least CONTRAST_SHARE of it in log terms; a planner that ignores the
#: pool plans 1. The verdicts are printed, not asserted: alternate 12k, measured to pay
#: (1.35 [1.08, 1.44], 1.66 [1.42, 1.74]), was planned at 1.08-1.13, on the threshold
#: (README "The decision held out").
CLEAR = 1.1
CONTRAST_SHARE = 0.25


def load_text() -> str:
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg())


def placement_contrast(table: pl.DataFrame) -> pl.DataFrame:
    """Per context: alternate's session gain over fixed's, measured and planned."""
    wide = table.pivot(
        on="placement",
        index="context_tokens",
        values=["session_gain_measured", "session_gain_planned"],
    )
    return wide.select(
        "context_tokens",
        measured=pl.col("session_gain_measured_alternate") / pl.col("session_gain_measured_fixed"),
        planned=pl.col("session_gain_planned_alternate") / pl.col("session_gain_planned_fixed"),
    )


def one_arm(
    path: Path, urls: list[str], cache: str, runs: Path, sets: Sequence[str] = DECISION_SETS
) -> Path:
    """The part of the scenario ``sets`` says, blocks of arm ``cache``, against running
    replicas, as a user runs them."""
    opts = replay.ReplayOptions(runs_dir=runs, endpoints=urls, cache=cache, progress=False)
    t0 = time.monotonic()
    out = replay.replay(scenario.load(path, list(sets)), opts)
    print(f"  {path.stem} {cache}: {time.monotonic() - t0:.0f} s, {load_text()}", flush=True)
    if out.failed:
        raise SystemExit(out.failure_summary())
    return out.run_dir


def both_arms_fit(passes: Sequence[tuple[Path, Path]], out: Path) -> tuple[fit.Fit, Path]:
    """Each pass of the probe (its pool-off and pool-on runs) merged, all fitted, the
    structure as the dev-mode pool-on pair told it."""
    merged = [
        merge_runs([off, on], out / f"probe-merged-{i}") for i, (off, on) in enumerate(passes)
    ]
    kv = kv_bytes_per_token()
    fixed = structure.structure(read_meta(passes[0][1]), kv_bytes_per_token=kv)
    result = fit.fit(merged, kv_bytes_per_token=kv, fixed=fixed)
    return result, fit.write_profile(result, out / "fitted-both.toml")


def measure(out: Path) -> tuple[Path, Path, list[tuple[Path, Path]]]:
    """Both arms on their pairs, one at a time: the decision's OFF and ON runs and the
    probe's passes (OFF, ON)."""
    sc = scenario.load(DECISION, DECISION_SETS)
    runs = out / "runs"
    with ManagedPair(
        sc.target.managed, sc.model.name, True, out / "on-logs", resettable=True
    ) as on:
        print(f"  pool-ON pair ready in {on.ready_s:.0f} s", flush=True)
        probe_on = one_arm(PROBE, on.urls, "on", runs, sets=())
        on_run = one_arm(DECISION, on.urls, "on", runs)
        probe_on_after = one_arm(PROBE, on.urls, "on", runs, sets=())
    with ManagedPair(sc.target.managed, sc.model.name, False, out / "off-logs") as off:
        print(f"  pool-OFF pair ready in {off.ready_s:.0f} s", flush=True)
        probe_off = one_arm(PROBE, off.urls, "off", runs, sets=())
        off_run = one_arm(DECISION, off.urls, "off", runs)
        probe_off_after = one_arm(PROBE, off.urls, "off", runs, sets=())
    return off_run, on_run, [(probe_off, probe_on), (probe_off_after, probe_on_after)]


def check(out: Path, seeds: int, pays_at: float) -> list[str]:
    """Run everything; the checks that failed (empty: all held)."""
    sc = scenario.load(DECISION, DECISION_SETS)
    spec = sc.target.managed
    off_run, on_run, passes = measure(out)
    failed: list[str] = []
    both, profile = both_arms_fit(passes, out)
    store = fit.STORE
    print(f"\nboth arms' fit:\n{fit.summary_text(both)}")
    if both.resampling is None or both.resampling.runs != 2:
        failed.append("the fit did not resample over the probe's two passes")
    if both.design is None or store in both.design.first_token.held:
        failed.append(f"{store} held, not a column of the fit's design")
    if "every request ran with the pool" in both.not_identified.get(store, ""):
        failed.append(f"{store} not identified: {both.not_identified[store]}")
    measured = heldout.measured_decision(
        load_run(merge_runs([off_run, on_run], out / "merged")), pays_at
    )
    planned_dir = plan.plan(
        DECISION,
        overrides=[
            *DECISION_SETS,
            f"target.sim.profile={profile}",
            f"target.sim.pool_chunk_tokens={spec.chunk_size}",
            f"target.sim.pool_capacity_gib={spec.pool_size_gb}",
        ],
        runs_dir=out / "plans",
        seeds=seeds,
        pays_at=pays_at,
    )
    planned = pl.read_parquet(planned_dir / "whatif.parquet")
    if not (planned["parameter_draws"] == seeds - 1).all():
        failed.append("the plan did not use the fit's draws")
    table = heldout.compare(planned, measured)
    shown = table.select(
        "placement", "context_tokens", "load_level",
        "session_gain_measured", "session_gain_measured_low", "session_gain_measured_high",
        "session_gain_planned", "session_gain_planned_low", "session_gain_planned_high",
        "session_gain_error", "later_gain_measured", "later_gain_planned", "later_gain_error",
        "verdict_measured", "verdict_planned",
    )  # fmt: skip
    summary = heldout.summary(table)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, float_precision=3):
        print(f"\nheld-out decision (pays at {pays_at}), {load_text()}:\n{shown}\n{summary}")
    if table.height != 2 * 3:
        failed.append(f"{table.height} cells, not placements x levels (6)")
    if not (table["sessions_measured"] == sc.sessions.count).all():
        failed.append("a cell's sessions incomplete in the measured arms")
    if not (table["sessions_planned"] == seeds * sc.sessions.count).all():
        failed.append("a cell's sessions incomplete in the plan")
    for side in ("planned", "measured"):  # each verdict reads its own interval
        for row in table.iter_rows(named=True):
            low, high = row[f"session_gain_{side}_low"], row[f"session_gain_{side}_high"]
            want = "pays" if low >= pays_at else "does not pay" if high < pays_at else "undecided"
            if row[f"verdict_{side}"] != want:
                failed.append(f"{side} verdict {row[f'verdict_{side}']!r}, interval says {want}")
    for row in summary.iter_rows(named=True):
        level = row["load_level"]
        line = (
            f"{level:g} in flight: session gain error median {row['session_gain_median_abs']:.3f}"
            f" worst {row['session_gain_worst_abs']:.3f}, later-turn gain error median "
            f"{row['later_gain_median_abs']:.3f}; verdict right in {row['right']} of "
            f"{row['decided']} decided cells, agree in {row['agree']} of {row['cells']}"
        )
        print(line)
        if row["session_gain_median_abs"] > DECISION_BOUNDS[level]:
            failed.append(line)
    alone = table.filter(pl.col("load_level") == 1.0)
    contrasts = placement_contrast(alone)
    print(f"alternate / fixed session gain at 1 in flight:\n{contrasts}")
    short = contrasts.filter(
        pl.col("measured") >= CLEAR,
        pl.col("planned").log() < CONTRAST_SHARE * pl.col("measured").log(),
    )
    if contrasts.height != alone["context_tokens"].n_unique():
        failed.append("a context's contrast is missing")
    if short.height:
        failed.append(f"1 in flight: placement contrast short in {short.height} contexts")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="plan replicates (seeds x draws)")
    parser.add_argument("--pays-at", type=float, default=1.1)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "real-decision-check")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"start: {load_text()}, {os.cpu_count()} cores", flush=True)
    failed = check(args.out, args.seeds, args.pays_at)
    print(f"\n{time.monotonic() - t0:.0f} s, {load_text()}")
    if failed:
        print("FAILED:\n" + "\n".join(f"  {line}" for line in failed))
        sys.exit(1)
    print("all checks held")


if __name__ == "__main__":
    main()
