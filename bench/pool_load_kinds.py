"""Are the probe's pool loads the decision's? Both kinds timed alternately on one REAL pair.

    .venv/bin/python bench/pool_load_kinds.py [--rounds 3] [--contexts 8192,12000,16384]
        [--sessions 6] [--endpoints URL,URL]

The fit measures the pool's load cost on scenarios/fitprobe.toml's ``move-at:4`` turns
(three turns on one replica, the fourth moved: its whole context loaded from the pool);
the decision (scenarios/decision-cpu.toml, alternate placement) loads it on turn 2, right
after turn 1 stored it, with growing (frozen) history instead of a re-sent context. If
LMCache served the two differently, a profile fitted on the probe would mis-plan the
decision. Per round, on one pool-ON pair (started from decision-cpu's [target.managed],
or ``--endpoints``), this replays both at each context size, one session in flight, the
order of the two swapped every round, and keeps each session's pool-loading turn (its
first cross-replica turn with external hits: turn 4 and turn 2). Prints per kind and
context the median TTFT of those turns with a 95% bootstrap interval (sessions the
units: one loading turn per session), and the ratio decision / probe with its interval.

Measured here (2026-12-03, 2 cores, quiet, 4 rounds of 6 sessions) in README
("Capacity planning", the decision held out). Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from tempfile import TemporaryDirectory

import polars as pl

from sessiongen import replay, scenario
from sessiongen.analysis import stats
from sessiongen.launch.pair import ManagedPair
from sessiongen.records.run import load_run

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "scenarios" / "fitprobe.toml"
DECISION = ROOT / "scenarios" / "decision-cpu.toml"
#: Per kind: the scenario and its overrides (one session in flight, the ON arm only).
KINDS: dict[str, tuple[Path, list[str]]] = {
    "probe move-at:4": (PROBE, ["sessions.turns=4"]),
    "decision alternate": (
        DECISION,
        ['placement.policies=["alternate"]', "sessions.turns=2", "load.levels=[1]"],
    ),
}


def loading_turns(run_dir: Path) -> pl.DataFrame:
    """Each session's first cross-replica turn served with external (pool) hits."""
    ok = load_run(run_dir).ok.filter(~pl.col("warmup"))
    return (
        ok.filter(pl.col("cross_replica") & (pl.col("external_hit_tokens") > 0))
        .sort("turn")
        .group_by("session_id", maintain_order=True)
        .first()
        .select("context_tokens", "session_id", "turn", "ttft_s", "external_hit_tokens")
    )


def one_kind(kind: str, urls: list[str], contexts: list[int], sessions: int, seed: int,
             runs: Path) -> pl.DataFrame:  # fmt: skip
    path, sets = KINDS[kind]
    sc = scenario.load(path, [
        *sets, f"seed={seed}", f"sessions.count={sessions}",
        f"sessions.initial_context_tokens={contexts}",
        'design.cache=["on"]', 'design.blocks=["on"]',
    ])  # fmt: skip
    opts = replay.ReplayOptions(runs_dir=runs, endpoints=urls, cache="on", progress=False)
    out = replay.replay(sc, opts)
    if out.failed:
        raise SystemExit(out.failure_summary())
    return loading_turns(out.run_dir).with_columns(pl.lit(kind).alias("kind"))


def summary(frame: pl.DataFrame) -> None:
    """Median loading TTFT per kind and context, and decision / probe, with intervals."""
    print(f"{'context':>8} {'kind':<20} {'sessions':>8}  median TTFT s [95%]")
    probe, decision = KINDS
    for context in sorted(frame["context_tokens"].unique().to_list()):
        sub = frame.filter(pl.col("context_tokens") == context)
        values = {k: sub.filter(pl.col("kind") == k)["ttft_s"].to_numpy() for k in KINDS}
        for kind, v in values.items():
            ci = stats.bootstrap_quantile(v, seed=stats.stable_seed(1, kind, context))
            print(f"{context:>8} {kind:<20} {ci.n:>8}  {ci.estimate:.3f} [{ci.low:.3f}, "
                  f"{ci.high:.3f}]")  # fmt: skip
        ratio = stats.bootstrap_ratio(
            values[decision], values[probe], seed=stats.stable_seed(2, context)
        )
        print(f"{context:>8} {'decision / probe':<20} {'':>8}  {ratio.estimate:.2f} "
              f"[{ratio.low:.2f}, {ratio.high:.2f}]")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contexts", default="8192,12000,16384")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--endpoints", default="", help="a running pool-ON pair (no start)")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",") if c]
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores", flush=True)
    with TemporaryDirectory() as tmp:
        pair = None
        urls = [u for u in args.endpoints.split(",") if u]
        if not urls:
            managed = scenario.load(DECISION).target.managed
            pair = ManagedPair(managed, "tiny", True, Path(tmp) / "logs")
            pair.start()
            urls = pair.urls
            print(f"pair ready in {pair.ready_s:.0f} s", flush=True)
        try:
            parts = []
            for r in range(args.rounds):
                order = list(KINDS) if r % 2 == 0 else list(reversed(KINDS))
                for i, kind in enumerate(order):
                    seed = 7000 + 10 * r + i
                    part = one_kind(kind, urls, contexts, args.sessions, seed, Path(tmp))
                    med = part.group_by("context_tokens").agg(pl.col("ttft_s").median())
                    shown = ", ".join(f"{c}: {m:.3f} s" for c, m in sorted(med.rows()))
                    print(f"round {r + 1} {kind:<20} {shown}", flush=True)
                    parts.append(part)
        finally:
            if pair is not None:
                pair.stop()
    summary(pl.concat(parts))


if __name__ == "__main__":
    main()
