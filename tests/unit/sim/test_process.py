"""The simulator as a subprocess: starts on free ports, answers, and leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiongen import scenario as scenario_mod
from sessiongen.errors import EndpointError
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim
from sessiongen.targets.sim import SimTarget
from tests.support import descendants
from tests.support.paths import SCENARIOS

PROFILE = SimProfile(time_scale=0.001)
#: Long enough to exit whatever the machine's load; a stopped simulator that waits for
#: its requests in flight takes aiohttp's 60 s per connection.
EXIT_DEADLINE_S = 30.0


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


def hold_a_request(url: str) -> socket.socket:
    """A long streamed request whose client stays connected without reading: in flight."""
    body = json.dumps(
        {
            "model": "m1",
            "messages": [{"role": "user", "content": "hello " * 2000}],
            "max_tokens": 5000,
            "stream": True,
        }
    ).encode()
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    assert sock.recv(12).startswith(b"HTTP/1.1 200")  # its handler is running
    return sock


@pytest.fixture
def busy_sim() -> Iterator[tuple[SimHandle, socket.socket]]:
    """A simulator in real time with a request in flight on its second replica (the one
    whose engine clock stopped with the first replica's clean-up)."""
    sim = start_sim(SimProfile(time_scale=1.0), "m1", shared_cache=True)
    try:
        held = hold_a_request(sim.urls[1])
        try:
            yield sim, held
        finally:
            held.close()
    finally:
        sim.stop(timeout_s=0.5)


def test_sigterm_does_not_wait_for_a_request_in_flight(
    busy_sim: tuple[SimHandle, socket.socket],
) -> None:
    sim, _ = busy_sim
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.proc.wait(timeout=EXIT_DEADLINE_S) == 0


def test_closed_stdin_stops_it_with_a_request_in_flight(
    busy_sim: tuple[SimHandle, socket.socket],
) -> None:
    """The parent died mid-request: the simulator must go (it used to spin on its closed
    stdin at 95% of a core for over a minute, deaf to SIGTERM)."""
    sim, _ = busy_sim
    assert sim.proc.stdin is not None
    sim.proc.stdin.close()
    assert sim.proc.wait(timeout=EXIT_DEADLINE_S) == 0


@pytest.mark.usefixtures("stop_signals_answered")  # before busy_sim starts its child
def test_a_second_signal_ends_a_stopping_simulator_at_once(
    busy_sim: tuple[SimHandle, socket.socket],
) -> None:
    sim, _ = busy_sim
    os.kill(sim.pid, signal.SIGHUP)  # stopping: its request in flight gets a grace period
    os.kill(sim.pid, signal.SIGTERM)
    # Not 0 (a clean stop): 128 plus whichever of the two it handled second.
    code = sim.proc.wait(timeout=EXIT_DEADLINE_S)
    assert code in (128 + signal.SIGHUP, 128 + signal.SIGTERM)


@pytest.mark.parametrize("wait_s", [0.0, 0.2, 0.5])
async def test_a_block_cancelled_while_its_simulator_starts_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait_s: float
) -> None:
    """What a replay does on Ctrl-C while the next block's simulator starts: the block's
    task is cancelled, then the target closed. The simulator must go with it, at any
    point of its start-up (the delays land in its imports, its start, its health wait;
    on a fast machine the last may find it ready, and closing the target stops it)."""
    tag = descendants.new_tag()
    monkeypatch.setenv(descendants.TAG_VAR, tag)
    target = SimTarget(scenario_mod.load(SCENARIOS / "smoke.toml"))
    target.attach(tmp_path)
    opening = asyncio.create_task(target.open_block("on"))
    deadline = asyncio.get_running_loop().time() + EXIT_DEADLINE_S
    while not descendants.tagged(tag) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert descendants.tagged(tag), "the simulator never started"
    await asyncio.sleep(wait_s)
    if opening.done():
        assert len(opening.result()) == 2
    else:
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
    await target.close()
    left = await asyncio.to_thread(descendants.survivors, tag, EXIT_DEADLINE_S)
    descendants.kill(left)
    assert not left, descendants.describe(left)
