"""Both arms on replicas the user runs, with ``sessiongen sim serve`` standing in for them.

Three designs, each against simulated replicas in child processes reached as endpoints:
two pairs at once (``--endpoints-off``/``--endpoints-on``), one pair switched between
blocks by a command (``--switch-command``, here ``sessiongen sim switch``, which calls
the simulator's admin routes), and two single-arm runs merged afterwards (``report RUN_OFF
RUN_ON``). Each must give the embedded pair's per-turn speedups and whole-session gain.

"Within their intervals": the simulator's model is deterministic, so a cell's interval
only spans the wall-clock lateness of its requests and is narrow (turn 1: 1.000 to
1.002); lateness that differs between two runs (a busy core in one block) moves a
median by more than that (turn 1 read 1.02x in one run, 1.00x in the next). Each
interval is therefore widened by its own run's measured lateness, the measurement error
the report shows per cell (client TTFT minus the simulator's own, as a share of the
median; 0.5 to 13% per cell at time scale 0.5 here). A block sent to the wrong pair
moves turn 2 from 2.2x to 1.0x or 0.45x, far outside any of them.

And a mislabeled arm (``--cache on`` against replicas without a shared cache, the reported
reproduction) is reported under Problems with its evidence, and exits 1 with
``--strict-arms``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner, Result

from sessiongen import analysis, report, scenario
from sessiongen import replay as replay_mod
from sessiongen.analysis.arms import MISLABELED, OK
from sessiongen.cli import cli
from sessiongen.records.run import Run
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim
from tests.support.paths import ROOT

SMOKE = str(ROOT / "scenarios/smoke.toml")
#: 0.5 wall s per modeled s, smoke's own: the smallest cell (a local hit, ~0.06 modeled s)
#: takes 30 ms, so a few ms of lateness stay within the widened intervals.
TIME_SCALE = 0.5
#: Five sessions: the fewest for which the intervals cover as stated.
SETS = ["sessions.count=5", f"target.sim.time_scale={TIME_SCALE}"]
#: The README's switch command for sim serve (python -m sessiongen: this checkout).
SWITCH = f"{sys.executable} -m sessiongen sim switch --shared-cache {{arm}}"


def sim(shared_cache: bool) -> SimHandle:
    return start_sim(SimProfile(time_scale=TIME_SCALE), "sim-27b", shared_cache=shared_cache)


@pytest.fixture(scope="module")
def pairs() -> Iterator[tuple[SimHandle, SimHandle]]:
    """A pair without the shared cache and one with it (``sim serve --shared-cache``)."""
    with sim(shared_cache=False) as off, sim(shared_cache=True) as on:
        yield off, on


def replay(runs: Path, *args: str, sets: tuple[str, ...] = ()) -> Result:
    """``sessiongen replay smoke.toml ARGS`` through click's runner, no progress."""
    cmd = ["replay", SMOKE, "--runs-dir", str(runs), "--no-progress", *args]
    for item in (*SETS, *sets):
        cmd += ["--set", item]
    return CliRunner().invoke(cli, cmd)


def only_run(runs: Path) -> Path:
    [run_dir] = [p for p in runs.iterdir() if (p / "manifest.json").exists()]
    return run_dir


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same scenario on the embedded simulated pair (restarted for every block)."""
    runs = tmp_path_factory.mktemp("embedded")
    sc = scenario.load(SMOKE, SETS)
    out = replay_mod.replay(sc, replay_mod.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    return analysis.load_run(out.run_dir)


def joined(urls: list[str]) -> str:
    return ",".join(urls)


def lateness(run: Run) -> dict[int, float]:
    """Per turn: the largest measured lateness share of the two arms' cells, summed."""
    err = analysis.measurement_error(run)
    return {
        int(turn): float(group["error_share"].abs().sum())
        for (turn,), group in err.group_by("turn")
    }


def intervals(run: Run) -> dict[str, tuple[float, float]]:
    """Per turn and for the whole session: the speedup interval widened by lateness."""
    late = lateness(run)
    out = {}
    for row in analysis.speedup_table(run).iter_rows(named=True):
        e = late[row["turn"]]
        out[f"turn {row['turn']}"] = (
            row["speedup_ci_low"] * (1 - e),
            row["speedup_ci_high"] * (1 + e),
        )
    [whole] = analysis.session_speedup(run).iter_rows(named=True)
    e = max(late.values())
    out["session"] = (whole["speedup_ci_low"] * (1 - e), whole["speedup_ci_high"] * (1 + e))
    return out


def assert_same_speedups(run: Run, embedded: Run) -> None:
    ours, theirs = intervals(run), intervals(embedded)
    assert ours.keys() == theirs.keys() == {"turn 1", "turn 2", "turn 3", "session"}
    apart = {
        cell: (ours[cell], theirs[cell])
        for cell in ours
        if max(ours[cell][0], theirs[cell][0]) > min(ours[cell][1], theirs[cell][1])
    }
    assert not apart, apart
    # The pool's effect itself: turn 2 moved to the other replica, served from the pool.
    [turn2] = analysis.speedup_table(run).filter(pl.col("turn") == 2).iter_rows(named=True)
    assert turn2["speedup_ci_low"] > 1.5


def assert_arms_hold(run: Run) -> None:
    """External hits in ON blocks only, each block's replicas in its arm, fresh salts."""
    hits = run.requests.group_by("cache").agg(pl.col("external_hit_tokens").sum())
    by_arm = dict(hits.iter_rows())
    assert by_arm["off"] == 0 and by_arm["on"] > 0
    check = analysis.arm_check(run)
    assert check["status"].to_list() == [OK] * 4, check
    blocks = run.meta.blocks
    assert [b["cache"] for b in blocks] == ["off", "on", "on", "off"]
    for block in blocks:
        said = {c["configured"] for c in block["kv_connector"]}
        assert said == {block["cache"] == "on"}, block
    assert len({b["salt"] for b in blocks}) == 4


# --- two pairs at once -------------------------------------------------------------------


def test_two_pairs_give_the_embedded_pairs_speedups(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle], embedded: Run
) -> None:
    off, on = pairs
    result = replay(
        tmp_path,
        "--no-report",
        "--endpoints-off",
        joined(off.urls),
        "--endpoints-on",
        joined(on.urls),
    )
    assert result.exit_code == 0, result.output
    assert "mislabeled" not in result.output
    run = analysis.load_run(only_run(tmp_path))
    assert run.meta.target_kind == "endpoint-pairs"
    servers = run.meta.target["servers"]
    assert [(s["arm"], s["url"]) for s in servers] == [
        *(("off", u) for u in off.urls),
        *(("on", u) for u in on.urls),
    ]
    assert_arms_hold(run)
    assert_same_speedups(run, embedded)
    # No prompt repeats across arms (fresh salts): equivalence is not exercised, and said so.
    assert "needles not exercised" in result.output


# --- one pair switched by the user's command -----------------------------------------------


def test_a_pair_switched_by_a_command_gives_the_embedded_pairs_speedups(
    tmp_path: Path, embedded: Run
) -> None:
    with sim(shared_cache=True) as pair:  # starts in the wrong arm for the first block
        command = f"{SWITCH} {' '.join(pair.urls)}"
        result = replay(
            tmp_path, "--no-report", "--endpoints", joined(pair.urls), "--switch-command", command
        )
    assert result.exit_code == 0, result.output
    run_dir = only_run(tmp_path)
    run = analysis.load_run(run_dir)
    assert run.meta.target_kind == "switched"
    switches = [b["switch"] for b in run.meta.blocks]
    assert [s["arm"] for s in switches] == ["off", "on", "on", "off"]
    assert [s["reported_arm"] for s in switches] == ["off", "on", "on", "off"]
    assert all(s["exit_status"] == 0 and s["command"].startswith(sys.executable) for s in switches)
    assert switches[0]["command"].endswith(f"sim switch --shared-cache off {' '.join(pair.urls)}")
    log = (run_dir / "switch-1.log").read_text()
    assert "switched to shared cache on" in log
    assert_arms_hold(run)
    assert_same_speedups(run, embedded)


def test_a_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path) -> None:
    mark = tmp_path / "switched"
    runs = tmp_path / "runs"
    result = replay(
        runs,
        "--dry-run",
        "--endpoints",
        "http://127.0.0.1:9,http://127.0.0.1:10",  # nothing listens: nothing is sent
        "--switch-command",
        f"touch {mark}-{{arm}}",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "target switched: 4 blocks, a fresh salt per block (the replicas cannot be restarted cold)"
    )
    assert [line.split(":", 1)[0] for line in lines[1:]] == [
        "[block 0] alternate cache=off",  # as the logs: switch-0.log
        "[block 1] alternate cache=on",
        "[block 2] alternate cache=on",
        "[block 3] alternate cache=off",
    ]
    assert f"run `touch {mark}-off`, then wait until http://127.0.0.1:9" in lines[1]
    assert f"run `touch {mark}-on`" in lines[2] and "none reports cache off" in lines[2]
    assert not runs.exists() and not list(tmp_path.glob("switched-*"))


def test_a_failing_switch_fails_its_block_with_the_commands_words(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle]
) -> None:
    _off, on = pairs
    command = "echo 'cannot reach the cluster' >&2; exit 3 # {arm}"
    result = replay(
        tmp_path,
        "--no-report",
        "--endpoints",
        joined(on.urls),
        "--switch-command",
        command,
        sets=('design.blocks=["off","on"]',),
    )
    assert result.exit_code == 1, result.output
    assert "2 block_start_failed" in result.output
    manifest = json.loads((only_run(tmp_path) / "manifest.json").read_text())
    for block in manifest["blocks"]:
        assert block["status"] == "failed"
        assert "the command exited with status 3: cannot reach the cluster" in block["error"]


def test_replicas_that_stay_in_the_other_arm_fail_the_block(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle]
) -> None:
    _off, on = pairs  # the shared cache stays on: the command changes nothing
    result = replay(
        tmp_path,
        "--no-report",
        "--endpoints",
        joined(on.urls),
        "--switch-command",
        "true {arm}",
        sets=('design.blocks=["off","on"]', "target.switch_timeout_s=1.5"),
    )
    assert result.exit_code == 1, result.output
    manifest = json.loads((only_run(tmp_path) / "manifest.json").read_text())
    off_block, on_block = manifest["blocks"]
    assert off_block["status"] == "failed"
    assert (
        "within 1.5 s (target.switch_timeout_s) the replicas were still reporting cache on, "
        "not off: " in off_block["error"]
    )
    assert on_block["status"] == "ok" and on_block["switch"]["reported_arm"] == "on"


# --- single-arm runs merged afterwards -------------------------------------------------------


def test_two_single_arm_runs_merged_give_the_embedded_pairs_speedups(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle], embedded: Run
) -> None:
    dirs = []
    for arm, pair in zip(("off", "on"), pairs, strict=True):
        result = replay(
            tmp_path / arm, "--no-report", "--endpoints", joined(pair.urls), "--cache", arm
        )
        assert result.exit_code == 0, result.output
        assert f"cache {arm} only: no speedup" in result.output  # one arm alone
        assert "-x" not in result.output and "speedup  " not in result.output
        dirs.append(str(only_run(tmp_path / arm)))
    result = CliRunner().invoke(cli, ["report", *dirs])
    assert result.exit_code == 0, result.output
    merged = Path(result.output.splitlines()[0].removeprefix("merged: "))
    run = analysis.load_run(merged)
    assert_arms_hold(run)
    assert_same_speedups(run, embedded)
    cautions = report.read_cautions(merged / "report")
    assert cautions is not None
    assert not any("Mislabeled" in p or "no OFF" in p for p in cautions["problems"])


# --- a mislabeled arm --------------------------------------------------------------------------

ONE_ARM = ('design.blocks=["on","on"]', 'design.cache=["on"]', "sessions.count=2")


def test_an_on_arm_without_a_shared_cache_is_reported_with_its_evidence(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle]
) -> None:
    off, _on = pairs  # the reported case: --cache on against sim serve --shared-cache off
    # Sent anyway (else the replay stops at the first block: test_arm_mismatch.py), so
    # that the counters judge it.
    args = ["--endpoints", joined(off.urls), "--cache", "on", "--allow-arm-mismatch"]
    result = replay(tmp_path, *args, sets=ONE_ARM)
    assert result.exit_code == 0, result.output  # not strict: warned and reported
    warnings = [w for w in result.output.splitlines() if w.startswith("warning: mislabeled arm:")]
    assert len(warnings) == 2
    assert "block 0 (alternate, labeled cache on): " in warnings[0]
    assert "0 external hit tokens" in warnings[0]
    assert "the replicas' counters moved 0 external hit tokens over the block" in warnings[0]
    assert "the replicas say: no KV connector" in warnings[0]
    run_dir = only_run(tmp_path)
    cautions = report.read_cautions(run_dir / "report")
    assert cautions is not None
    [problem] = [p for p in cautions["problems"] if p.startswith("Mislabeled arm:")]
    assert "2 of 2 blocks are not in the cache arm they are labeled with" in problem
    assert warnings[0].removeprefix("warning: mislabeled arm: ") in problem
    manifest: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    engine = manifest["target"]["servers"][0]["engine"]["kv_connector"]
    assert engine["configured"] is False and "vllm:external_prefix_cache_hits" in engine["metrics"]


def test_strict_arms_exit_1_on_a_mislabeled_arm(
    tmp_path: Path, pairs: tuple[SimHandle, SimHandle]
) -> None:
    _off, on = pairs  # --cache off against replicas that share a cache
    sets = ('design.blocks=["off"]', 'design.cache=["off"]', "sessions.count=2")
    args = ["--no-report", "--endpoints", joined(on.urls), "--cache", "off", "--strict-arms"]
    args.append("--allow-arm-mismatch")  # sent, so that the counters judge it
    result = replay(tmp_path, *args, sets=sets)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("sessiongen: error")]
    assert errors == [
        f"sessiongen: error: mislabeled arms: 1 blocks contradict their cache arm; see "
        f"{only_run(tmp_path)}"
    ]
    run = analysis.load_run(only_run(tmp_path))
    [row] = analysis.arm_check(run).iter_rows(named=True)
    assert row["status"] == MISLABELED and row["external_hit_tokens"] > 0
    assert row["replicas_say"] == "on"
