"""A block whose replicas say at start they are in the other arm is stopped before it is
sent: the pairs given swapped once ran for 73 s and exited 0.

``sessiongen sim serve`` pairs stand in for the user's replicas: the simulator says
whether its shared cache is on (its ``sessiongen_sim_info`` gauge), as vLLM's
``/server_info`` does in dev mode. Nothing here waits on a clock: the stop comes before
any request, and the allowed run is asserted on counts, not times.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from sessiongen.cli import cli
from sessiongen.replay.armcheck import arm_contradiction
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim
from tests.support.paths import ROOT

SMOKE = str(ROOT / "scenarios/smoke.toml")
#: One short OFF block, then ON: the stop must come at the first.
SETS = (
    'design.blocks=["off","on"]',
    "sessions.count=1",
    "sessions.turns=2",
    "target.sim.time_scale=0.05",
)


@pytest.fixture(scope="module")
def pairs() -> Iterator[tuple[SimHandle, SimHandle]]:
    """A pair without the shared cache and one with it (``sim serve --shared-cache``)."""
    profile = SimProfile(time_scale=0.05)
    with (
        start_sim(profile, "sim-27b", shared_cache=False) as off,
        start_sim(profile, "sim-27b", shared_cache=True) as on,
    ):
        yield off, on


def replay(runs: Path, *args: str) -> Result:
    cmd = ["replay", SMOKE, "--runs-dir", str(runs), "--no-progress", "--no-report", *args]
    for item in SETS:
        cmd += ["--set", item]
    return CliRunner().invoke(cli, cmd)


def only_run(runs: Path) -> Path:
    [run_dir] = [p for p in runs.iterdir() if (p / "manifest.json").exists()]
    return run_dir


def test_swapped_pairs_stop_before_the_first_block_is_sent(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle]
) -> None:
    off, on = pairs
    swapped = ["--endpoints-off", ",".join(on.urls), "--endpoints-on", ",".join(off.urls)]
    result = replay(tmp_path, *swapped)
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("sessiongen: ")]
    assert error.startswith(
        "sessiongen: error: block 0 (alternate, cache off) not sent: its replicas contradict "
        f"the arm at start: {on.urls[0]} says a KV connector (from sessiongen_sim_info); "
        f"{on.urls[1]} says a KV connector"
    ), error
    assert error.endswith("--allow-arm-mismatch runs it anyway)")
    run_dir = only_run(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    [block] = manifest["blocks"]  # the ON block never opened
    assert block["status"] == "failed" and block["error"] in error
    assert manifest["complete"] is False
    sent = run_dir / "requests.parquet"
    assert not sent.exists() or pl.read_parquet(sent).filter(~pl.col("warmup")).is_empty()


def test_the_user_can_send_it_anyway(tmp_path: Path, pairs: tuple[SimHandle, SimHandle]) -> None:
    off, on = pairs
    swapped = ["--endpoints-off", ",".join(on.urls), "--endpoints-on", ",".join(off.urls)]
    result = replay(tmp_path, *swapped, "--allow-arm-mismatch")
    assert result.exit_code == 0, result.output
    manifest = json.loads((only_run(tmp_path) / "manifest.json").read_text())
    assert [b["status"] for b in manifest["blocks"]] == ["ok", "ok"]
    assert manifest["scenario"]["target"]["allow_arm_mismatch"] is True
    # Still judged afterwards by the counters and what the replicas said.
    assert "warning: mislabeled arm: block 0" in result.output


def test_pairs_in_their_arms_are_not_stopped(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle]
) -> None:
    off, on = pairs
    result = replay(
        tmp_path, "--endpoints-off", ",".join(off.urls), "--endpoints-on", ",".join(on.urls)
    )
    assert result.exit_code == 0, result.output
    assert "not sent" not in result.output


def test_silent_replicas_are_not_judged() -> None:
    urls = ["http://a", "http://b"]
    assert arm_contradiction(0, "fixed", "on", urls, [{}, {"metrics": []}]) is None
    said_off = {"configured": False, "source": "server_info"}
    assert arm_contradiction(0, "fixed", "off", urls, [said_off, said_off]) is None
    line = arm_contradiction(3, "fixed", "on", urls, [{}, said_off])
    assert line is not None and "http://b says no KV connector (from server_info)" in line
    assert "http://a" not in line and line.startswith("block 3 (fixed, cache on) not sent")
