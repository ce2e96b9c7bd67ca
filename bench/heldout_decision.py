"""The pool decision held out on the REAL CPU pair: planned gain and verdict against measured.

    .venv/bin/python bench/heldout_decision.py [--pays-at 1.1] [--seeds 10] [--sizes large,small]
        [--profile fitted.toml] [--alone-only] [--passes 2] [--out DIR]
        [--tables-only [--without-noise]]

Fits a profile on scenarios/fitprobe.toml and scenarios/fitprobe-load.toml
(``--alone-only``: the first alone), both arms, on the large size's pairs (the ON pair in
dev mode, so the replicas tell their structure; skipped with ``--profile``). With
``--passes 2`` (the default) fitprobe runs again on each pair after the decision's blocks
and each pass's two arms are merged apart, so the fit's intervals are over passes, then
sessions, and hold the machine's drift between a run's phases (as the real-stack decision
test does). Then for
each KV cache size replays scenarios/decision-cpu.toml (3k and 12k contexts, alternate
and fixed placement, 1, 2 and 4 sessions in flight) on a pool-ON pair and a pool-OFF
pair (no connector) of that size, merges the two single-arm runs, and plans the same
scenario with the fitted profile (``--seeds`` replicates: seeds and the fit's bootstrap
draws). Per cell (KV size x placement x context x in flight) it prints and writes
(``heldout_decision.csv`` and ``.parquet`` in ``--out``) the measured and planned
session gain and later-turn gain with their 95% intervals (sessions the units), the
error planned / measured - 1, both verdicts against ``--pays-at`` and whether they agree
(:mod:`sessiongen.capacity.heldout`), then per KV size and level the summary.

KV sizes: ``large`` is VLLM_CPU_KVCACHE_SPACE=2 (about a million tokens of builtin:tiny: it
holds every cell's working set); ``small`` cuts each replica's cache to 100 blocks of 128
tokens (``--num-gpu-blocks-override``; 12,672 usable tokens, the planner told the same):
one 12k session fits, two do not, and four 3k sessions just do not.

Pair starts: 2 per size, each 1.5-2.5 minutes here; the ON arm always runs before the
OFF arm, the probes before the decision's blocks. ``--tables-only`` recomputes the
tables from ``--out``'s runs without any pair. Prints, asserts nothing.

Measured here (2026-12-04, 2 cores, load average 3-6; 21 min with the fit), pays at 1.1,
10 replicates, two passes. The fit: store cost 22.3 s/GB [6.1, 37.8], pool loads 21.2
s/GB, decode batching 2.3 ms, service-time noise 0.045 [0.030, 0.069]. In brackets, the
same runs and fit planned without the noise (``--tables-only
--without-noise``: the fitted profile with ``prefill_noise_sigma = 0``):

| KV | in flight | median abs session-gain error | worst | cells within 15% | decided cells right |
|---|---|---|---|---|---|
| large | 1 | 13.5% (14.0%) | 14.1% | 4 of 4 | 3 of 3 (3) |
| large | 2 | 12.4% (24.5%) | 23% | 2 of 4 | 1 of 1 (0) |
| large | 4 | 31% (21%) | 43% | 1 of 4 | none decided |
| small | 1 | 7.3% (7.6%) | 8.2% | 4 of 4 | 4 of 4 (4) |
| small | 2 | 24% (32%) | 44% | 1 of 4 | 1 of 1 (1) |
| small | 4 | 41% (38%) | 68% | 1 of 4 | 1 of 1 (1) |

Planned verdicts on the wrong side of a decided cell: none with the noise, 1 without
(alternate 12k at two in flight: measured 1.86 [1.40, 2.05], planned 1.44 with the
noise and 0.75 without, every replicate queueing its second turn behind the next
session's 12k prefill). An earlier run the same day (noise drawn in submit order): 1
wrong with the noise, 3 without. README "Service-time noise" and "The decision held out
on the real pair".
"""

from __future__ import annotations

import argparse
import os
import re
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
PROBE = ROOT / "scenarios" / "fitprobe.toml"
LOADED_PROBE = ROOT / "scenarios" / "fitprobe-load.toml"
DECISION = ROOT / "scenarios" / "decision-cpu.toml"
#: vLLM-cpu's KV block; the small cache's blocks (one is vLLM's null block).
BLOCK = 128
SMALL_BLOCKS = 100
#: Per KV size: the scenario's overrides for the pair, and the planner's.
SIZES: dict[str, tuple[list[str], list[str]]] = {
    "large": ([], []),
    "small": (
        [
            f'target.managed.vllm_args=["--num-gpu-blocks-override", "{SMALL_BLOCKS}"]',
            f"target.managed.max_model_len={(SMALL_BLOCKS - 1) * BLOCK}",
        ],
        [
            f"target.sim.local_cache_tokens={(SMALL_BLOCKS - 1) * BLOCK}",
            f"target.sim.max_model_len={(SMALL_BLOCKS - 1) * BLOCK}",
        ],
    ),
}
#: Columns the printed table shows (the files keep every column).
SHOWN = [
    "kv", "placement", "context_tokens", "load_level",
    "session_gain_measured", "session_gain_measured_low", "session_gain_measured_high",
    "session_gain_planned", "session_gain_planned_low", "session_gain_planned_high",
    "session_gain_error", "later_gain_measured", "later_gain_planned", "later_gain_error",
    "verdict_measured", "verdict_planned", "agree",
]  # fmt: skip


def load_text() -> str:
    return "load average " + ", ".join(f"{v:.1f}" for v in os.getloadavg())


def arm(pair: ManagedPair, cache: str, runs: Path, overrides: Sequence[str]) -> Path:
    """The decision scenario's blocks of arm ``cache`` on the running pair."""
    sc = scenario.load(DECISION, list(overrides))
    opts = replay.ReplayOptions(runs_dir=runs, endpoints=pair.urls, cache=cache, progress=False)
    t0 = time.monotonic()
    out = replay.replay(sc, opts)
    print(f"  {cache} arm: {time.monotonic() - t0:.0f} s, {load_text()}", flush=True)
    if out.failed:
        raise SystemExit(out.failure_summary())
    return out.run_dir


def started(
    overrides: Sequence[str], cache_on: bool, logs: Path, *, resettable: bool = False
) -> ManagedPair:
    sc = scenario.load(DECISION, list(overrides))
    pair = ManagedPair(sc.target.managed, sc.model.name, cache_on, logs, resettable=resettable)
    pair.start()
    print(f"  pair cache {'on' if cache_on else 'off'}: ready in {pair.ready_s:.0f} s", flush=True)
    return pair


def probes(pair: ManagedPair, cache: str, out: Path, loaded: bool) -> list[Path]:
    """fitprobe (and fitprobe-load when ``loaded``) blocks of arm ``cache`` on the pair:
    the run folders in that order."""
    runs = []
    for path in (PROBE, LOADED_PROBE) if loaded else (PROBE,):
        opts = replay.ReplayOptions(runs_dir=out / "runs", endpoints=pair.urls, cache=cache,
                                    progress=False)  # fmt: skip
        t0 = time.monotonic()
        done = replay.replay(scenario.load(path), opts)
        print(f"  {path.stem} {cache}: {time.monotonic() - t0:.0f} s, {load_text()}", flush=True)
        if done.failed:
            raise SystemExit(done.failure_summary())
        runs.append(done.run_dir)
    return runs


def fitted_profile(on: Sequence[Path], off: Sequence[Path], out: Path) -> Path:
    """The probes' two arms merged per probe run (``on[i]`` with ``off[i]``: the same probe
    of the same pass), fitted; the profile file with its draws (the summary printed: which
    terms the runs identify)."""
    pairs = zip(on, off, strict=True)
    merged = [merge_runs([b, a], out / "runs" / f"{a.name}-merged") for a, b in pairs]
    # The structure (KV block, cache, scheduler limits) as the dev-mode ON pair told it.
    kv = kv_bytes_per_token()
    fixed = structure.structure(read_meta(on[0]), kv_bytes_per_token=kv)
    result = fit.with_loaded(fit.fit(merged, kv_bytes_per_token=kv, fixed=fixed), merged)
    print(fit.summary_text(result), flush=True)
    path = fit.write_profile(result, out / "fitted.toml")
    print(f"  fitted {path} ({load_text()})", flush=True)
    return path


def planned(
    profile: Path, size: str, out: Path, seeds: int, pays_at: float, plans: str = "plans"
) -> Path:
    spec = scenario.load(DECISION).target.managed
    sets = [
        f"target.sim.profile={profile}",
        f"target.sim.pool_chunk_tokens={spec.chunk_size}",
        f"target.sim.pool_capacity_gib={spec.pool_size_gb}",
        *SIZES[size][1],
    ]
    t0 = time.monotonic()
    folder = plan.plan(DECISION, overrides=sets, runs_dir=out / f"{plans}-{size}", seeds=seeds,
                       pays_at=pays_at)  # fmt: skip
    print(f"  planned {size}: {time.monotonic() - t0:.0f} s", flush=True)
    return folder


def main() -> None:
    global DECISION
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pays-at", type=float, default=1.1)
    parser.add_argument("--seeds", type=int, default=10, help="plan replicates (seeds x draws)")
    parser.add_argument("--sizes", default="large,small")
    parser.add_argument("--profile", type=Path, default=None, help="skip the fit")
    parser.add_argument("--alone-only", action="store_true", help="fit without the loaded probe")
    parser.add_argument(
        "--passes", type=int, choices=(1, 2), default=2,
        help="2: fitprobe again on each pair after the decision's blocks",
    )  # fmt: skip
    parser.add_argument(
        "--scenario", type=Path, default=DECISION,
        help="the decision scenario (bench/validation/PROTOCOL.md names its own)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "heldout-decision")
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="no pairs: the tables again from --out's merged runs and latest plans",
    )
    parser.add_argument(
        "--without-noise",
        action="store_true",
        help="with --tables-only: plan again with --out's fit, its noise set to 0",
    )
    args = parser.parse_args()
    DECISION = args.scenario.resolve()
    sizes = [s for s in args.sizes.split(",") if s]
    out = args.out
    if args.tables_only:
        plans = "plans"
        if args.without_noise:
            plans = "plans-without-noise"
            quiet = without_noise(out / "fitted.toml")
            for size in sizes:
                planned(quiet, size, out, args.seeds, args.pays_at, plans)
        tables = [compared(out, size, args.pays_at, plans) for size in sizes]
        show(out, tables, "heldout_decision" + plans.removeprefix("plans"))
        return
    out.mkdir(parents=True, exist_ok=True)
    print(f"start: {load_text()}, {os.cpu_count()} cores", flush=True)
    profile = args.profile
    loaded = not args.alone_only
    if profile is None and "large" not in sizes:  # the fit needs the large cache
        sizes = ["large", *sizes]
        print("  the fit runs on the large cache's pairs: large added", flush=True)
    if profile is None:
        sizes = ["large", *(s for s in sizes if s != "large")]
    tables = []
    for size in sizes:
        pair_sets = SIZES[size][0]
        runs = out / f"runs-{size}"
        print(f"KV {size}:", flush=True)
        # the fit runs on the large size's pairs, ON first (dev mode: /server_info)
        fitting = profile is None
        on_pair = started(pair_sets, True, out / f"logs-{size}-on", resettable=fitting)
        try:
            probes_on = probes(on_pair, "on", out, loaded) if fitting else []
            on_run = arm(on_pair, "on", runs, pair_sets)
            if fitting and args.passes == 2:
                probes_on += probes(on_pair, "on", out, False)
        finally:
            on_pair.stop()
        off_pair = started(pair_sets, False, out / f"logs-{size}-off")
        try:
            probes_off = probes(off_pair, "off", out, loaded) if fitting else []
            off_run = arm(off_pair, "off", runs, pair_sets)
            if fitting and args.passes == 2:
                probes_off += probes(off_pair, "off", out, False)
        finally:
            off_pair.stop()
        merge_runs([off_run, on_run], runs / "merged")
        if fitting:
            profile = fitted_profile(probes_on, probes_off, out)
        assert profile is not None
        planned(profile, size, out, args.seeds, args.pays_at)
        tables.append(compared(out, size, args.pays_at))
    show(out, tables)
    print(f"end: {load_text()}")


def without_noise(profile: Path) -> Path:
    """A copy of the fitted profile (and its draws) with ``prefill_noise_sigma = 0``."""
    text = re.sub(r"(?m)^prefill_noise_sigma = .*$", "prefill_noise_sigma = 0.0",
                  profile.read_text())  # fmt: skip
    quiet = profile.with_name(f"{profile.stem}-without-noise.toml")
    quiet.write_text(text)
    return quiet


def compared(out: Path, size: str, pays_at: float, plans: str = "plans") -> pl.DataFrame:
    """One KV size's cells: its merged replay against its latest plan."""
    measured = heldout.measured_decision(load_run(out / f"runs-{size}" / "merged"), pays_at)
    latest = sorted((out / f"{plans}-{size}").glob("plan-*"))[-1]
    plan_rows = pl.read_parquet(latest / "whatif.parquet")
    table = heldout.compare(plan_rows, measured).with_columns(pl.lit(size).alias("kv"))
    return table.select("kv", *(c for c in table.columns if c != "kv"))


def show(out: Path, tables: Sequence[pl.DataFrame], name: str = "heldout_decision") -> None:
    table = pl.concat(tables)
    table.write_csv(out / f"{name}.csv")
    table.write_parquet(out / f"{name}.parquet")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, float_precision=3):
        print(table.select(SHOWN))
        print(heldout.summary(table, by=("kv", "load_level")))
    print(f"written {out / name}.csv")


if __name__ == "__main__":
    main()
