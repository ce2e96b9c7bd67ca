"""Benchmark: which share of spoiled pool chunks the equivalence probe detects on the real pair.

    .venv/bin/python bench/real_fault_detection.py [--shares 0.01,0.05,0.2] [--seeds 0]
        [--kind stale] [--sessions 8] [--scenario scenarios/smoke-cpu.toml]

Needs the real stack (``make real-stack``) and the machine to itself: each run starts
two managed pairs (OFF, then ON with the fault), 1.5 to 3 minutes each on 2 cores. Prints
figures, asserts nothing.

For every share and fault seed, ``sessiongen replay`` of the scenario (default
smoke-cpu, the shipped real-stack scenario with the equivalence probe) with
``target.managed.fault`` planted, blocks OFF then ON (the scenario's second ON block would
send the same prompts and be hit in the same chunks: the choice is a hash of each chunk's
tokens, so it adds no trial). ``--sessions`` replaces the scenario's session count: more
distinct prompts, more independent trials per run.

Per run: the chunks the ON replicas loaded from the pool and how many the fault hit (the
replicas' fault logs, warm-ups included), and for the pool-served requests the probe
judged: how many had at least one chunk hit, and how many of those and of the others
diverged from OFF (a load is matched to its request by replica and send order, which is
exact at ``driver.concurrency = 1``). Whether the run is caught: its equivalence verdict.
Then, from the requests: the share of hit requests that diverged (per-chunk sensitivity),
and what that means for the shipped scenario: with C distinct pool-served chunks judged
and every hit request caught, a run at share p is caught with probability 1 - (1 - p)^C.
Run as the Correctness page says (``--sessions 8``, the rest default), it writes its
figures to ``docs/data/real_fault_detection.json``, which that page quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _docs import record

from sessiongen import analysis, replay, scenario
from sessiongen.analysis.correctness import CACHE_FAILURE
from sessiongen.launch import faults

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Outcome:
    """One fault run: what the fault hit, what diverged, the verdict."""

    share: float
    seed: int
    chunks: int
    chunks_hit: int
    served: int  # pool-served requests judged against OFF
    served_hit: int  # of them, with at least one chunk hit
    hit_diverged: int
    single: int  # hit requests with exactly one spoiled chunk
    single_diverged: int
    unhit_diverged: int
    served_chunks: int  # distinct pool chunks those requests loaded
    verdict: str
    minutes: float


def loads_by_request(run_dir: Path, manifest: dict[str, Any]) -> pl.DataFrame:
    """Every load the fault logged, matched to the ON request it served (block, session,
    turn): per replica, the n-th logged load is the n-th ON request with external hits."""
    requests = pl.read_parquet(run_dir / "requests.parquet")
    rows = []
    for index, block in enumerate(manifest["target"]["blocks"]):
        if block["cache"] != "on":
            continue
        for replica in range(int(manifest["target"]["replicas"])):
            log = Path(block["log_dir"]) / faults.LOG_NAME.format(index=replica)
            loads = (
                [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            )
            served = requests.filter(
                (pl.col("block") == index)
                & (pl.col("replica") == replica)
                & (pl.col("external_hit_tokens").fill_null(0) > 0)
            ).sort("send_s")
            if served.height != len(loads):
                raise SystemExit(
                    f"{run_dir}: replica {replica} logged {len(loads)} loads for "
                    f"{served.height} requests with external hits: cannot match them"
                )
            for load, req in zip(loads, served.iter_rows(named=True), strict=True):
                rows.append(
                    {
                        "block": index,
                        "session_id": req["session_id"],
                        "turn": req["turn"],
                        "warmup": req["warmup"],
                        "chunks": load["chunks"],
                        "chunks_hit": len(load["hit"]),
                    }
                )
    return pl.DataFrame(rows)


def run_once(base: Path, kind: str, share: float, seed: int, args: argparse.Namespace) -> Outcome:
    sets = [
        f"target.managed.fault.kind={kind}",
        f"target.managed.fault.share={share}",
        f"target.managed.fault.seed={seed}",
        'design.blocks=["off","on"]',
    ]
    if args.sessions:
        sets.append(f"sessions.count={args.sessions}")
    started = time.perf_counter()
    out = replay.replay(
        scenario.load(base, sets), replay.ReplayOptions(runs_dir=args.runs_dir, progress=False)
    )
    if out.failed or out.interrupted:
        raise SystemExit(f"{out.run_dir}: {out.failure_summary() or 'interrupted'}")
    manifest = json.loads((out.run_dir / "manifest.json").read_text())
    run = analysis.load_run(out.run_dir)
    eq = analysis.correctness(run).equivalence
    loads = loads_by_request(out.run_dir, manifest)
    judged = analysis.divergences(run).filter(pl.col("pool_served"))
    joined = judged.join(loads, on=["block", "session_id", "turn"], how="left")
    hit = joined.filter(pl.col("chunks_hit").fill_null(0) > 0)
    unhit = joined.filter(pl.col("chunks_hit").fill_null(0) == 0)
    failed = pl.col("verdict") == CACHE_FAILURE
    return Outcome(
        share=share,
        seed=seed,
        chunks=int(loads["chunks"].sum()),
        chunks_hit=int(loads["chunks_hit"].sum()),
        served=judged.height,
        served_hit=hit.height,
        hit_diverged=hit.filter(failed).height,
        single=hit.filter(pl.col("chunks_hit") == 1).height,
        single_diverged=hit.filter(failed & (pl.col("chunks_hit") == 1)).height,
        unhit_diverged=unhit.filter(failed).height,
        served_chunks=int(joined["chunks"].fill_null(0).sum()),
        verdict=eq.verdict,
        minutes=(time.perf_counter() - started) / 60,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios/smoke-cpu.toml")
    parser.add_argument("--kind", default="stale", choices=["stale", "noise"])
    parser.add_argument("--shares", default="0.01,0.05,0.2")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--sessions", type=int, default=0, help="0: the scenario's own count")
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_args()
    asked = argparse.Namespace(**vars(args))
    if args.runs_dir is None:
        args.runs_dir = Path(tempfile.mkdtemp(prefix="fault-bench-"))
    shares = [float(s) for s in args.shares.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    sessions = args.sessions or "the scenario's"
    print(f"{args.scenario.name}, fault {args.kind}, {sessions} sessions, runs in {args.runs_dir}")
    print(
        "share  seed  chunks hit/loaded  pool-served: hit  hit->diverged  unhit->diverged"
        "  verdict          min"
    )
    outcomes = []
    for share in shares:
        for seed in seeds:
            o = run_once(args.scenario, args.kind, share, seed, args)
            outcomes.append(o)
            print(
                f"{share:5.0%}  {seed:4d}  {o.chunks_hit:6d}/{o.chunks:<6d}     "
                f"{o.served_hit:3d}/{o.served:<3d}       {o.hit_diverged:3d}/{o.served_hit:<3d}"
                f"        {o.unhit_diverged:3d}/{o.served - o.served_hit:<3d}         "
                f"{o.verdict:<15}  {o.minutes:4.1f}",
                flush=True,
            )
    hit = sum(o.served_hit for o in outcomes)
    caught = sum(o.hit_diverged for o in outcomes)
    missed_unhit = sum(o.unhit_diverged for o in outcomes)
    print(f"requests with >= 1 spoiled chunk that diverged: {caught} of {hit}")
    single = sum(o.single for o in outcomes)
    single_caught = sum(o.single_diverged for o in outcomes)
    print(f"  of them with exactly one spoiled chunk: {single_caught} of {single}")
    print(f"requests with no spoiled chunk that diverged: {missed_unhit} (expected 0)")
    figures: dict[str, float] = {
        "hit.diverged": caught,
        "hit.requests": hit,
        "single.diverged": single_caught,
        "single.requests": single,
        "unhit.diverged": missed_unhit,
    }
    print("runs caught (equivalence verdict cache failure):")
    for share in shares:
        runs = [o for o in outcomes if o.share == share]
        n = sum(o.verdict == CACHE_FAILURE for o in runs)
        print(f"  share {share:5.0%}: {n} of {len(runs)}")
        key = f"share{share * 100:g}".replace(".", "_")
        figures[f"{key}.caught"], figures[f"{key}.runs"] = n, len(runs)
        figures[f"{key}.diverged"] = sum(o.hit_diverged + o.unhit_diverged for o in runs)
        figures[f"{key}.served"] = sum(o.served for o in runs)
    # The shipped scenario as shipped: its sessions, each judged on the same pool chunks
    # (per session) as here, in every ON block alike.
    shipped = scenario.load(args.scenario).sessions.count
    run_sessions = args.sessions or shipped
    per_session = sum(o.served_chunks for o in outcomes) / (len(outcomes) * run_sessions)
    distinct = round(shipped * per_session)
    print(
        f"{args.scenario.name} as shipped judges {distinct} distinct pool chunks "
        f"({shipped} sessions x {per_session:.0f}); if every hit request is caught, a run "
        "is caught with probability 1 - (1 - share)^chunks:"
    )
    for share in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2):
        print(f"  share {share:5.1%}: {1 - (1 - share) ** distinct:6.1%}")
    documented = parser.parse_args(["--sessions", "8"])
    record("real_fault_detection", figures, args=asked, documented=documented)


if __name__ == "__main__":
    main()
