"""Replay through the user's own router (placement ``gateway``): what is sent, and how the
serving replica is found (counters, a response header) or left unknown.

The gateway here is a small round-robin proxy (tests/support/gateway.py) in front of the
simulated pair, so these tests need no vllm-router; tests/integration/test_router.py runs
the real one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from sessiongen import replay, scenario
from sessiongen.cli import cli
from sessiongen.errors import MissingDependencyError, ScenarioError
from sessiongen.launch import router as router_launch
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim
from tests.support.fakeserver import ThreadServer
from tests.support.gateway import SEEN, make_gateway

RAW: dict[str, Any] = {
    "name": "gw",
    "sessions": {
        "count": 2,
        "turns": 3,
        "initial_context_tokens": 4096,  # two of the simulated pool's 1,568-token chunks
        "question_tokens": 16,
        "answer_tokens": 24,
        "output_tokens": 4,
    },
    "placement": {"policies": ["gateway"]},
    "design": {"cache": ["on"], "blocks": ["on"], "warmup_requests": 1},
    "driver": {"concurrency": 1, "request_timeout_s": 30},
    "target": {"router": {"session_user": True}},
}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim(SimProfile(time_scale=0.05), "sim-27b", shared_cache=True) as handle:
        yield handle


def run(tmp_path: Path, sc: scenario.Scenario, **opts: Any) -> tuple[pl.DataFrame, Path]:
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False, **opts))
    assert out.failed == 0, out.failure_summary()
    return pl.read_parquet(out.run_dir / "requests.parquet"), out.run_dir


def test_counters_find_the_replica_a_silent_gateway_chose(tmp_path: Path, sim: SimHandle) -> None:
    with ThreadServer(make_gateway(sim.urls)) as gw:
        sc = scenario.from_dict(RAW, "gw.toml", [f"target.gateway={gw.url}"])
        df, _ = run(tmp_path, sc, endpoints=sim.urls, cache="on")
        seen = list(gw.app[SEEN])
    routed = df.filter(pl.col("replica_source") != "placement").sort("send_s")
    # Every routed request (the gateway warm-ups first) is found, and where it really went.
    assert routed["replica_source"].unique().to_list() == ["counters"]
    assert routed["replica"].to_list() == [f.replica for f in seen]
    measured = routed.filter(~pl.col("warmup"))
    assert measured.height == 2 * 3
    later = measured.filter(pl.col("turn") > 1)
    assert later["cross_replica"].all()  # the gateway alternates, one session at a time
    # It was told the session in the header and, as asked, in the body's user field.
    for record, sent in zip(routed.iter_rows(named=True), seen, strict=True):
        assert sent.headers["x-session-id"] == record["session_id"]
        assert sent.body["user"] == record["session_id"]
    # The served replica's counters attribute the hits: turn 2 comes from the pool, turn 3
    # (back on turn 1's replica) from that replica's own cache.
    hits = later.sort("turn")
    assert (hits.filter(pl.col("turn") == 2)["external_hit_tokens"] > 0).all()
    assert (hits.filter(pl.col("turn") == 3)["local_hit_tokens"] > 0).all()


def test_with_nothing_to_go_on_the_replica_is_unknown_never_guessed(
    tmp_path: Path, sim: SimHandle
) -> None:
    with ThreadServer(make_gateway(sim.urls)) as gw:
        result = CliRunner().invoke(
            cli,
            [
                "replay",
                str(_toml(tmp_path)),
                "--gateway",
                gw.url,
                "--endpoints",
                ",".join(sim.urls),
                "--cache",
                "on",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--no-progress",
                "--set",
                "driver.concurrency=2",  # overlapping requests: counters cannot tell
            ],
        )
    assert result.exit_code == 0, result.output
    assert "Placements and routers" in result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    df = pl.read_parquet(run_dir / "requests.parquet").filter(~pl.col("warmup"))
    assert df["replica_source"].unique().to_list() == ["unknown"]
    assert df["replica"].null_count() == df.height
    assert df.filter(pl.col("turn") == 1)["cross_replica"].to_list() == [False, False]
    assert df.filter(pl.col("turn") > 1)["cross_replica"].null_count() == 4
    report = (run_dir / "report" / "report.md").read_text()
    assert "The serving replica is unknown for 6 of 6 routed requests" in report
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["target"]["kind"] == "endpoints"
    assert manifest["target"]["router"]["gateway"] == gw.url


def test_a_response_header_names_the_replica_behind_a_gateway(
    tmp_path: Path, sim: SimHandle
) -> None:
    with ThreadServer(make_gateway(sim.urls, strip=())) as gw:
        sc = scenario.from_dict(
            RAW,
            "gw.toml",
            [
                f"target.gateway={gw.url}",
                "target.replica_header=x-sim-replica",
                "driver.concurrency=2",
            ],
        )
        # No replica URLs (so no counters), and the sessions run in two worker processes.
        df, _ = run(tmp_path, sc, cache="on", workers=2)
        seen = list(gw.app[SEEN])
    assert df["replica_source"].unique().to_list() == ["header"]
    went = {
        (f.headers["x-session-id"], sum(m["role"] == "user" for m in f.body["messages"])): f.replica
        for f in seen
    }
    assert len(went) == len(seen) == df.height
    for row in df.iter_rows(named=True):
        assert row["replica"] == went[(row["session_id"], row["turn"])]


def test_placements_that_cannot_run_fail_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway_only = scenario.from_dict(
        RAW, "gw.toml", ["target.gateway=http://127.0.0.1:9", 'placement.policies=["fixed"]']
    )
    with pytest.raises(ScenarioError, match="'fixed' sends turns to replicas the client picks"):
        replay.replay(gateway_only, replay.ReplayOptions(runs_dir=tmp_path, cache="on"))
    no_gateway = scenario.from_dict(RAW, "gw.toml")
    with pytest.raises(ScenarioError, match='placement "gateway" needs a router'):
        replay.replay(no_gateway, replay.ReplayOptions(runs_dir=tmp_path))
    monkeypatch.setattr(router_launch.importlib.util, "find_spec", lambda name: None)
    routed = scenario.from_dict(RAW, "gw.toml", ['placement.policies=["router:round_robin"]'])
    with pytest.raises(MissingDependencyError, match=r"install-router\.sh"):
        replay.replay(routed, replay.ReplayOptions(runs_dir=tmp_path))
    assert list(tmp_path.iterdir()) == []  # no run folder was started


def _toml(tmp_path: Path) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text(
        'name = "gw"\n'
        "[sessions]\ncount = 2\nturns = 3\ninitial_context_tokens = 512\n"
        "question_tokens = 16\nanswer_tokens = 24\noutput_tokens = 4\n"
        '[design]\ncache = ["on"]\nblocks = ["on"]\nwarmup_requests = 1\n'
        "[driver]\nconcurrency = 1\nrequest_timeout_s = 30\n"
    )
    return path
