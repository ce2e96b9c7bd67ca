"""Replay against given endpoints: records, block filtering, faults, unreachable targets."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from sessiongen import analysis, replay, scenario
from sessiongen.cli import cli
from sessiongen.errors import EndpointError, UserError
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim
from tests.support.fakeserver import ThreadServer, make_app
from tests.support.paths import ROOT

RAW: dict[str, Any] = {
    "name": "fake",
    "sessions": {
        "count": 2,
        "turns": 3,
        "initial_context_tokens": 300,
        "question_tokens": 20,
        "answer_tokens": 30,
        "output_tokens": 4,
    },
    "placement": {"policies": ["alternate", "fixed"]},
    "design": {"warmup_requests": 1},
    "driver": {"concurrency": 2, "request_timeout_s": 5},
}


def run(tmp_path: Path, urls: list[str], cache: str = "on", **raw_kw: Any) -> replay.ReplayResult:
    raw = {**RAW, **raw_kw}
    sc = scenario.from_dict(raw, "fake.toml")
    opts = replay.ReplayOptions(runs_dir=tmp_path, endpoints=urls, cache=cache, progress=False)
    return replay.replay(sc, opts)


def test_records_one_row_per_request_and_only_the_stated_arm(tmp_path: Path) -> None:
    with ThreadServer(make_app("ok")) as a, ThreadServer(make_app("ok")) as b:
        out = run(tmp_path, [a.url, b.url], cache="on")
    assert (
        out.failed == 0 and out.requests == 2 * 2 * 3 * 2
    )  # policies x ON blocks x turns x sessions
    df = pl.read_parquet(out.run_dir / "requests.parquet")
    measured = df.filter(~pl.col("warmup"))
    assert measured.height == out.requests
    assert set(measured["cache"]) == {"on"}
    # blocks x replicas x warmup_requests, each run on its replica and then on the other
    assert df.filter(pl.col("warmup")).height == 2 * 2 * 2 * 2
    alt = measured.filter((pl.col("placement") == "alternate") & (pl.col("session_index") == 0))
    assert alt.sort(["block", "turn"])["replica"].to_list()[:3] == [0, 1, 0]
    assert alt.filter(pl.col("turn") > 1)["cross_replica"].all()
    fixed = measured.filter(pl.col("placement") == "fixed")
    assert not fixed["cross_replica"].any()
    assert (measured["ttft_s"] > 0).all() and (measured["e2e_s"] >= measured["ttft_s"]).all()
    manifest = json.loads((out.run_dir / "manifest.json").read_text())
    assert manifest["complete"] is True
    assert manifest["target"]["kind"] == "endpoints" and manifest["target"]["cache"] == "on"
    assert [b["cache"] for b in manifest["blocks"]] == ["on"] * 4
    # Endpoints cannot restart: every block gets its own salt, so no block meets another's cache.
    assert len({b["salt"] for b in manifest["blocks"]}) == 4


def test_failed_turn_stops_its_session_and_run_goes_on(tmp_path: Path) -> None:
    def fail_fourth(n: int) -> str | None:
        return "http500" if n == 6 else None  # 2 warm-ups, then measured requests

    with ThreadServer(make_app("ok", fail_on=fail_fourth)) as a:
        out = run(tmp_path, [a.url], placement={"policies": ["fixed"]}, driver={"concurrency": 1})
    assert out.failures == {"http_error": 1}
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    failed = df.filter(pl.col("status") != "ok")
    assert failed.height == 1 and failed["error"][0].startswith("HTTP 500")
    sid = failed["session_id"][0]
    block = failed["block"][0]
    later = df.filter(
        (pl.col("session_id") == sid)
        & (pl.col("block") == block)
        & (pl.col("turn") > failed["turn"][0])
    )
    assert later.height == 0
    assert df.height == 2 * 2 * 3 - (3 - failed["turn"][0])


@pytest.mark.parametrize("mode", ["reset", "malformed", "truncated", "http400"])
def test_every_fault_is_recorded_not_raised(tmp_path: Path, mode: str) -> None:
    with ThreadServer(make_app(mode)) as a:
        out = run(
            tmp_path, [a.url], placement={"policies": ["fixed"]}, design={"warmup_requests": 0}
        )
    assert out.failed == 4  # every session fails at turn 1 in both ON blocks
    df = pl.read_parquet(out.run_dir / "requests.parquet")
    assert set(df["turn"]) == {1}


def test_unreachable_endpoint_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(EndpointError, match="unreachable"):
        run(tmp_path / "runs", ["http://127.0.0.1:9"])
    assert not (tmp_path / "runs").exists()


def test_wrong_model_is_a_one_line_error(tmp_path: Path) -> None:
    with (
        ThreadServer(make_app("ok", model="other")) as a,
        pytest.raises(EndpointError, match="does not serve model"),
    ):
        run(tmp_path, [a.url])


def test_endpoints_need_a_cache_arm(tmp_path: Path) -> None:
    sc = scenario.from_dict(RAW, "fake.toml")
    opts = replay.ReplayOptions(runs_dir=tmp_path, endpoints=["http://127.0.0.1:9"], progress=False)
    with pytest.raises(UserError, match="--cache on\\|off"):
        replay.replay(sc, opts)


@pytest.fixture(scope="module")
def sim_serve() -> Iterator[SimHandle]:
    """``sessiongen sim serve`` in a child process at time scale 0.05, reached as endpoints."""
    with start_sim(SimProfile(time_scale=0.05), "sim-27b", shared_cache=True) as handle:
        yield handle


def test_sim_serve_as_endpoints_is_simulated_in_modeled_seconds(
    tmp_path: Path, sim_serve: SimHandle
) -> None:
    """The reported case: both replicas say simulated (and now their time scale) in /version;
    the manifest, the console and the report say SIMULATED and read modeled seconds. The
    console is not a terminal here: progress is plain lines, never carriage returns."""
    args = ["replay", str(ROOT / "scenarios/smoke.toml"), "--runs-dir", str(tmp_path)]
    args += ["--endpoints", ",".join(sim_serve.urls), "--cache", "on"]
    for item in ("sessions.count=2", "sessions.turns=2", 'placement.policies=["fixed"]'):
        args += ["--set", item]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    [run_dir] = [p for p in tmp_path.iterdir() if (p / "manifest.json").exists()]
    target = json.loads((run_dir / "manifest.json").read_text())["target"]
    assert target["simulated"] is True and target["time_scale"] == 0.05
    assert target["time_scale_known"] is True and "SIMULATED" in target["note"]
    assert "Median TTFT per turn, modeled seconds (target: SIMULATED (endpoints))" in result.output
    assert "\r" not in result.output
    progress = [
        line for line in result.output.splitlines() if re.match(r"\[block \d+\] fixed", line)
    ]
    assert progress[0] == "[block 0] fixed cache=on: 0/4 turns"  # one line as each block starts
    assert progress[-1].startswith("[block 1] fixed cache=on: 4/4 turns, ")  # and as it ends
    assert all(" turns/s, errors 0" in line for line in progress if "4/4" in line)
    run = analysis.load_run(run_dir)
    raw = pl.read_parquet(run_dir / "requests.parquet").filter(~pl.col("warmup"))
    assert run.ok["ttft_s"].sum() == pytest.approx(raw["ttft_s"].sum() / 0.05)
    report = (run_dir / "report" / "report.md").read_text()
    assert "target SIMULATED (endpoints), time scale 0.05" in report
    assert "All durations are modeled seconds" in report and "measured seconds" not in report
    assert "## Measurement error (simulated target)" in report
