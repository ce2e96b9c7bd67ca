"""The simulator as a subprocess: starts on free ports, answers, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from sessiongen.errors import EndpointError
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import start_sim

PROFILE = SimProfile(time_scale=0.001)


def gone(pid: int) -> bool:
    """True when no process group ``pid`` exists any more (leader and children alike)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        data: dict[str, object] = json.loads(resp.read())
    return data


def test_start_sim_serves_and_stop_leaves_no_process() -> None:
    with start_sim(PROFILE, "m1", shared_cache=False) as sim:
        assert len(sim.urls) == 2 and len(set(sim.urls)) == 2
        assert all(u.startswith("http://127.0.0.1:") for u in sim.urls)
        config = get_json(sim.urls[1] + "/sim/config")
        assert config["shared_cache"] is False and config["model"] == "m1"
        assert config["profile"] == json.loads(json.dumps(config["profile"]))
        assert config["time_scale"] == 0.001
        sim.set_shared_cache(True)
        assert get_json(sim.urls[0] + "/sim/config")["shared_cache"] is True
        sim.reset(pool=True)
        pid = sim.pid
        assert not gone(pid)
    assert gone(pid)
    sim.stop()  # idempotent


def test_child_exits_when_its_parent_goes_away() -> None:
    sim = start_sim(PROFILE, "m1", shared_cache=True)
    try:
        assert sim.proc.stdin is not None
        sim.proc.stdin.close()  # what the kernel does when the parent dies
        assert sim.proc.wait(timeout=20) == 0
    finally:
        sim.stop()
    assert gone(sim.pid)


def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    sim = start_sim(PROFILE, "m1", shared_cache=True)
    # A hung child: stopped, it cannot act on SIGTERM, so stop() must escalate.
    os.kill(sim.pid, signal.SIGSTOP)  # SIGTERM stays pending; only SIGKILL ends it
    sim.stop(timeout_s=0.5)
    assert sim.proc.returncode == -9
    assert gone(sim.pid)


def test_start_sim_reports_a_child_that_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(EndpointError, match="exited with status 1"):
        start_sim(PROFILE, "m1", shared_cache=True)


def test_start_sim_gives_up_after_its_timeout_and_cleans_up() -> None:
    with pytest.raises(EndpointError, match="did not report its ports"):
        start_sim(PROFILE, "m1", shared_cache=True, startup_timeout_s=0.01)


def test_module_cli_rejects_a_bad_override_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sessiongen.sim", "--set", "target.sim.slowdown=-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "slowdown" in lines[0]
