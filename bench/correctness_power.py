"""Benchmark: how often the correctness probe fails a run whose pool corrupts some answers.
Prints only.

    .venv/bin/python bench/correctness_power.py [scenarios/*.toml ...]

A cache failure is a pool-served divergence rate above the noise baseline by a one-sided
exact test at 5% (sessiongen.analysis.correctness). What it takes depends on the counts a
scenario gives: ``pool`` ON requests the shared pool serves (cross-replica turns in ON
blocks) and ``baseline`` comparisons where it has no part (cold and local ON turns, and
every prompt's OFF answers against each other). Both are counted from the scenario's
structure (sessions x contexts x turns x blocks x load levels; placement ``alternate``
moves every later turn, ``move-at:K`` one, ``random`` half of them in expectation,
``router:round_robin`` every one, other routers and ``fixed`` none: pool hits of
sticky sessions whose prefix was evicted under cache pressure are not counted, so the
power of such scenarios is at least what is printed). With a clean
baseline (no divergence without the pool: float32 on the CPU pair, the simulator) and
each pool-served answer corrupted independently with probability ``c``, the detection
power is ``P(test rejects)`` summed exactly over the binomial number of corrupted
answers. Equivalence probes compare every answer; needle probes grade one needle per
turn, the same counts. Run with the defaults (every shipped scenario), it writes its figures
to ``docs/data/correctness_power.json``, which the Correctness page quotes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _docs import record
from scipy import stats as sps

from sessiongen.analysis.hypotheses import rate_exceeds
from sessiongen.scenario import Scenario
from sessiongen.scenario import load as load_scenario

SHARES = (0.01, 0.05, 0.20)
ALPHA = 0.05


def _cross_turns(policy: str, turns: int) -> float:
    if policy == "alternate" or policy == "router:round_robin":
        return turns - 1
    if policy.startswith("move-at:"):
        return 1.0 if int(policy.split(":")[1]) <= turns else 0.0
    if policy == "random":
        return (turns - 1) / 2
    return 0.0


def counts(scen: Scenario) -> tuple[int, int]:
    """(pool-served ON requests, baseline comparisons) of one run of the scenario."""
    s = scen.sessions
    per_arm = s.count * len(s.initial_context_tokens) * max(1, len(scen.load.levels))
    on = scen.design.blocks.count("on")
    off = scen.design.blocks.count("off")
    pool = base = 0.0
    for policy in scen.placement.policies:
        cross = _cross_turns(policy, s.turns)
        pool += per_arm * cross * on
        base += per_arm * (s.turns - cross) * on + per_arm * s.turns * max(0, off - 1)
    return round(pool), round(base)


def power(pool: int, base: int, share: float) -> float:
    """P(reject) with Binomial(pool, share) corrupted answers and a clean baseline."""
    total = 0.0
    for k in range(1, pool + 1):
        weight = float(sps.binom.pmf(k, pool, share))
        if weight < 1e-9 and k > pool * share:
            break
        if rate_exceeds(k, pool, 0, base) < ALPHA:
            total += float(sps.binom.sf(k - 1, pool, share))  # rejection is monotone in k
            break
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1] / "scenarios"
    paths = args.scenarios or sorted(root.glob("*.toml"))
    head = "  ".join(f"{share:>4.0%}" for share in SHARES)
    figures: dict[str, float] = {}
    print(f"{'scenario':<16} {'probe':<12} {'pool':>5} {'base':>5} {'fewest':>6}  {head}")
    for path in paths:
        scen = load_scenario(path)
        if scen.sessions.probe == "none":
            continue
        pool, base = counts(scen)
        fewest = next((k for k in range(1, pool + 1) if rate_exceeds(k, pool, 0, base) < ALPHA), 0)
        powers = {
            f"{path.stem}.power{round(100 * share)}": power(pool, base, share) for share in SHARES
        }
        figures |= powers | {f"{path.stem}.{k}": v for k, v in (("pool", pool), ("base", base))}
        figures[f"{path.stem}.fewest"] = fewest
        shares = "  ".join(f"{value:>4.0%}" for value in powers.values())
        print(
            f"{path.stem:<16} {scen.sessions.probe:<12} {pool:>5} {base:>5} {fewest:>6}  {shares}"
        )
    print("pool: pool-served ON requests; base: baseline comparisons; fewest: corrupted answers")
    print("the test needs against a clean baseline; then the power at each corrupted share")
    record("correctness_power", figures, args=args, documented=parser.parse_args([]))


if __name__ == "__main__":
    main()
