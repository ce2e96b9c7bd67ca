"""Router placements for real: vllm-router started per block in front of the simulated pair.

Every assertion is on counted values (which replica served each turn, hit tokens), never
on timings. Skipped, saying why, where vllm-router is not installed; ``make test``
installs it (scripts/install-router.sh), so CI runs these.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.infra import procs
from sessiongen.launch.router import ManagedRouter
from sessiongen.scenario.routerspec import RouterSpec
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm_router") is None,
    reason="vllm-router is not installed (scripts/install-router.sh; make test installs it)",
)

RAW: dict[str, Any] = {
    "name": "routed",
    "sessions": {
        "count": 2,
        "turns": 3,
        "initial_context_tokens": 4096,  # two of the simulated pool's 1,568-token chunks
        "question_tokens": 16,
        "answer_tokens": 24,
        "output_tokens": 4,
    },
    "placement": {
        "policies": ["router:round_robin", "router:consistent_hash", "router:cache_aware"]
    },
    "design": {"cache": ["on"], "blocks": ["on"], "warmup_requests": 1},
    "driver": {"concurrency": 1, "request_timeout_s": 60},
    "target": {"sim": {"time_scale": 0.05}},
}

Ran = tuple[pl.DataFrame, dict[str, Any], Path]


def run(runs: Path, *overrides: str) -> Ran:
    sc = scenario.from_dict(RAW, "routed.toml", list(overrides))
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    df = pl.read_parquet(out.run_dir / "requests.parquet")
    return df, json.loads((out.run_dir / "manifest.json").read_text()), out.run_dir


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run(tmp_path_factory.mktemp("routed"))


def test_each_routed_block_ran_behind_its_own_router(routed: Ran) -> None:
    _df, manifest, run_dir = routed
    assert manifest["complete"] is True
    blocks = manifest["blocks"]
    assert [b["placement"] for b in blocks] == RAW["placement"]["policies"]
    for block in blocks:
        router = block["router"]
        assert block["status"] == "ok" and router["stop"] == "stopped"
        assert f"router:{router['policy']}" == block["placement"]
        assert "--disable-retries" in router["argv"] and router["version"] == "0.1.17"
        assert procs.group_members(router["pgid"]) == []  # nothing left running
        assert Path(router["log"]).parent == run_dir
    assert manifest["target"]["router"]["routers_started"] == 3


def test_the_serving_replica_is_measured_two_ways_and_they_agree(routed: Ran) -> None:
    df, _, _ = routed
    # Measured turns and the warm-ups sent through each router: the simulator named the
    # replica in x-sim-replica, and at concurrency 1 its counters alone moved.
    through = df.filter(pl.col("replica_source") != "placement")
    assert through.height == 3 * (2 * 3 + 2)
    assert through["replica_source"].unique().to_list() == ["header+counters"]
    assert through["replica"].null_count() == 0


def moved(df: pl.DataFrame, placement: str) -> list[bool]:
    later = df.filter(~pl.col("warmup"), pl.col("placement") == placement, pl.col("turn") > 1)
    return later.sort("session_index", "turn")["cross_replica"].to_list()


def test_each_policy_moves_sessions_as_it_keys(routed: Ran) -> None:
    df, _, _ = routed
    # One session at a time: round_robin's global counter moves every turn; the session
    # header keeps consistent_hash sticky; cache_aware follows the longest text match.
    assert moved(df, "router:round_robin") == [True] * 4
    assert moved(df, "router:consistent_hash") == [False] * 4
    assert moved(df, "router:cache_aware") == [False] * 4
    measured = df.filter(~pl.col("warmup"), pl.col("turn") == 2)
    hits = {
        r["placement"]: r
        for r in measured.group_by("placement")
        .agg(pl.col("external_hit_tokens").min(), pl.col("local_hit_tokens").min())
        .iter_rows(named=True)
    }
    # The moved turn 2 is served from the pool; the sticky ones from the replica's own cache.
    assert hits["router:round_robin"]["external_hit_tokens"] > 0
    assert hits["router:consistent_hash"]["local_hit_tokens"] > 0


def test_with_overlapping_turns_the_response_alone_names_the_replica(tmp_path: Path) -> None:
    df, _, _ = run(
        tmp_path,
        'placement.policies=["router:round_robin"]',
        "driver.concurrency=2",
        "target.router.session_user=true",
    )
    measured = df.filter(~pl.col("warmup"))
    assert measured["replica_source"].unique().to_list() == ["header"]
    assert measured["replica"].null_count() == 0
    assert measured.filter(pl.col("turn") > 1)["cross_replica"].null_count() == 0


@pytest.fixture
def user_router(tmp_path: Path) -> Iterator[tuple[SimHandle, ManagedRouter]]:
    """A router the user runs: vllm-router (consistent_hash) in front of a simulated pair."""
    with start_sim(SimProfile(time_scale=0.05), "sim-27b", shared_cache=True) as sim:
        router = ManagedRouter("consistent_hash", sim.urls, RouterSpec(), tmp_path / "r.log")
        router.start()
        try:
            yield sim, router
        finally:
            router.stop()


def test_an_existing_router_as_the_gateway(
    tmp_path: Path, user_router: tuple[SimHandle, ManagedRouter]
) -> None:
    sim, router = user_router
    sc = scenario.from_dict(
        RAW,
        "routed.toml",
        [
            f"target.gateway={router.url}",
            'placement.policies=["gateway", "fixed"]',
            "target.replica_header=x-sim-replica",
        ],
    )
    opts = replay.ReplayOptions(runs_dir=tmp_path, progress=False, endpoints=sim.urls, cache="on")
    out = replay.replay(sc, opts)
    assert out.failed == 0, out.failure_summary()
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    gateway = df.filter(pl.col("placement") == "gateway")
    assert gateway["replica_source"].unique().to_list() == ["header+counters"]
    assert moved(df, "gateway") == [False] * 4  # consistent_hash on X-Session-ID: sticky
    assert df.filter(pl.col("placement") == "fixed")["replica_source"].unique().to_list() == [
        "placement"
    ]
    manifest = json.loads((out.run_dir / "manifest.json").read_text())
    assert all("router" not in b for b in manifest["blocks"])  # sessiongen started none
