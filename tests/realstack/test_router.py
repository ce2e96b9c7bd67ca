"""vllm-router in front of the REAL CPU pair: one managed block behind a round_robin
router, the pool on. The block leases the session's shared ON pair, cold (a pair start
only when it is the first to need it); the router is started and stopped for the block.
Its timeout scales with the pair start-up measured in the session (conftest.py).

What only the real stack can show: each vLLM replica names itself in its responses'
``system_fingerprint`` (``--fingerprint-mode custom``) through the router, the counters
agree on every turn, and the turn the router moved is served from LMCache's pool.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.infra import procs
from sessiongen.launch import commands
from tests.realstack.conftest import StartupClock
from tests.support.paths import ROOT

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="the real stack is not installed (scripts/install-real-stack.sh)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm_router") is None,
        reason="vllm-router is not installed (scripts/install-router.sh)",
    ),
    pytest.mark.pair_starts(1),
]


def test_round_robin_router_in_front_of_the_real_pair(
    tmp_path: Path, startup: StartupClock
) -> None:
    sc = scenario.load(
        ROOT / "scenarios/smoke-cpu.toml",
        [
            'placement.policies=["router:round_robin"]',
            'design.cache=["on"]',
            'design.blocks=["on"]',  # one block
            "driver.concurrency=1",
            *startup.overrides(),
        ],
    )
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False))
    assert out.failed == 0, out.failure_summary()
    manifest: dict[str, Any] = json.loads((out.run_dir / "manifest.json").read_text())
    (block,) = manifest["blocks"]
    router = block["router"]
    assert block["status"] == "ok" and router["stop"] == "stopped"
    assert router["policy"] == "round_robin" and procs.group_members(router["pgid"]) == []
    df = pl.read_parquet(out.run_dir / "requests.parquet")
    routed = df.filter(pl.col("replica_source") != "placement")
    assert routed.height == 2 * 3 + 2  # measured turns and the warm-ups through the router
    # Both ways of finding the replica told, and agreed, on every routed request.
    found = "fingerprint+counters" if commands.fingerprint_supported() else "counters"
    assert routed["replica_source"].unique().to_list() == [found]
    processes = manifest["target"]["blocks"][0]["processes"]
    replicas = [p for p in processes if p["role"] == "replica"]
    fingerprints = [p["argv"][p["argv"].index("--fingerprint-value") + 1] for p in replicas]
    assert fingerprints == ["sessiongen-replica-0", "sessiongen-replica-1"]
    measured = routed.filter(~pl.col("warmup")).sort("session_index", "turn")
    # One session at a time: round_robin moved every turn, and the pool served the moves.
    assert measured.filter(pl.col("turn") > 1)["cross_replica"].to_list() == [True] * 4
    turn2 = measured.filter(pl.col("turn") == 2)
    assert (turn2["external_hit_tokens"] >= 4096).all()
