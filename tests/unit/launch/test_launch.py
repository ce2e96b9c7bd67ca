"""The launcher's process handling with fake servers: fast, and no vLLM needed.

A fake "python" stands in for vLLM and LMCache: it takes the same command line, forks a
child in its process group (as vLLM forks its engine core) and serves the health URL.
That exercises start-up, fail-fast, deadlines, Ctrl-C, crashed replicas, stopping,
the state file and ``pair down``/``pair status`` exactly as with the real stack.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiongen.errors import EndpointError, MissingDependencyError, ScenarioError
from sessiongen.infra import files, net, procs
from sessiongen.launch import commands, state
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.procs import ProcessRecord
from sessiongen.scenario.spec import ManagedSpec

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, signal, sys, time

    args = sys.argv[1:]
    def opt(name):
        return int(args[args.index(name) + 1]) if name in args else None
    port = opt("--http-port") or opt("--port")
    mode = os.environ.get("FAKE_MODE", "ok")
    print("fake server", args[1], "port", port, flush=True)
    if os.environ.get("FAKE_CRASH_PORT") == str(port):
        print("fake: crashing on purpose", flush=True)
        sys.exit(3)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:  # like vLLM's engine core: same group, outlives a crashed parent
        while True:
            time.sleep(1)
    if mode == "slow" and "vllm" in args[1]:  # replicas never become healthy
        while True:
            time.sleep(1)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path in ("/health", "/healthcheck") else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An executable that runs the fake server whatever ``-m MODULE`` it is given."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(commands, "require_stack", lambda cache_on: None)
    return str(wrapper)


def make_spec(tmp_path: Path, **changes: object) -> ManagedSpec:
    fields: dict[str, object] = {"model": str(tmp_path), "startup_timeout_s": 30.0}
    fields.update(changes)
    return ManagedSpec(**fields)


def make_pair(spec: ManagedSpec, tmp_path: Path, fake_python: str, **kw: object) -> ManagedPair:
    return ManagedPair(
        spec, "tiny", True, tmp_path / "logs", python=fake_python, stop_grace_s=5.0, **kw
    )


def assert_all_gone(records: list[ProcessRecord]) -> None:
    for rec in records:
        assert procs.group_members(rec.pgid) == [], f"{rec.name} left processes behind"


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind((net.HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


# ----------------------------------------------------------------- ports and commands


def test_port_checks(listener: int) -> None:
    assert not net.port_is_free(listener)
    port = net.pick_free_port(avoid={listener})
    low, _ = net.ephemeral_range()
    assert port < low and port != listener and net.port_is_free(port)


def test_vllm_argv_has_connector_only_with_cache_on(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, vllm_args=("--enforce-eager",))
    common = dict(model_arg="/m", dummy_weights=True, served_name="tiny", host="127.0.0.1")
    on = commands.vllm_argv("py", spec, port=8011, lmcache_port=6555, **common)
    off = commands.vllm_argv("py", spec, port=8011, lmcache_port=None, **common)
    assert on[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert {"--enable-prompt-tokens-details", "--load-format", "dummy"} <= set(off)
    assert on[-1] == "--enforce-eager"
    config = json.loads(on[on.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "LMCacheMPConnector"
    assert config["kv_connector_extra_config"]["lmcache.mp.port"] == 6555
    assert "--kv-transfer-config" not in off
    assert [a for a in on if a not in off] == ["--kv-transfer-config", on[-2]]


def test_lmcache_argv_follows_spec(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, pool_size_gb=2.5, chunk_size=128, eviction="ARC")
    argv = commands.lmcache_argv("py", spec, "127.0.0.1", 6555, 9001)
    joined = " ".join(argv)
    assert "-m lmcache.cli.main server" in joined
    assert "--l1-size-gb 2.5 --chunk-size 128 --eviction-policy ARC" in joined
    assert "--supported-transfer-mode auto" in joined and "--http-port 9001" in joined


def test_env_overrides_and_gpu_slices(tmp_path: Path) -> None:
    cpu = commands.env_overrides(make_spec(tmp_path, env={"VLLM_CPU_KVCACHE_SPACE": "4"}), 0)
    assert cpu["HF_HUB_OFFLINE"] == "1" and cpu["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert cpu["GLOO_SOCKET_IFNAME"] == "lo"  # the CPU worker's Gloo group on loopback
    gpu = make_spec(tmp_path, device="cuda", replicas=2, gpus_per_replica=2)
    assert commands.env_overrides(gpu, 1, base_env={})["CUDA_VISIBLE_DEVICES"] == "2,3"
    listed = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert commands.env_overrides(gpu, 0, base_env=listed)["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert "CUDA_VISIBLE_DEVICES" not in commands.env_overrides(gpu, None, base_env={})
    with pytest.raises(ScenarioError, match="gpus_per_replica"):
        commands.env_overrides(gpu, 0, base_env={"CUDA_VISIBLE_DEVICES": "0,1"})
    argv = commands.vllm_argv(
        "py", gpu, model_arg="m", dummy_weights=False, served_name="m", host="h", port=1,
        lmcache_port=None,
    )  # fmt: skip
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"


def test_each_cpu_replica_gets_its_own_cores(tmp_path: Path) -> None:
    """Both arms run the same compute configuration: one share of the cores per replica.

    (vLLM's default "auto" binding gives a replica with the KV connector 2 threads over
    both cores of a 2-core machine and one without it 1 thread, both OFF replicas on
    core 0: the arms' cold turns differed 1.5-1.6x.)
    """
    pair = make_spec(tmp_path, replicas=2)

    def bind(spec: ManagedSpec, replica: int | None, cores: list[int]) -> str | None:
        env = commands.env_overrides(spec, replica, base_env={}, cores=cores)
        return env.get("VLLM_CPU_OMP_THREADS_BIND")

    assert [bind(pair, i, cores=[0, 1]) for i in range(2)] == ["0", "1"]
    assert bind(pair, None, cores=[0, 1]) is None  # LMCache is not a replica
    assert [bind(pair, i, cores=[4, 5, 6, 7]) for i in range(2)] == ["4,5", "6,7"]
    three = make_spec(tmp_path, replicas=3)
    assert [bind(three, i, cores=[0, 1]) for i in range(3)] == ["0", "1", "0"]  # round-robin
    one = make_spec(tmp_path, replicas=1)
    assert bind(one, 0, cores=[0, 1]) == "0,1"
    listed = make_spec(tmp_path, replicas=2, cpu_cores=(3, 2))
    assert [bind(listed, i, cores=[0, 1]) for i in range(2)] == ["3", "2"]
    # The user's setting wins, from the scenario or from the environment.
    mine = make_spec(tmp_path, env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    assert bind(mine, 1, cores=[0, 1]) == "nobind"
    env = commands.env_overrides(pair, 1, base_env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env  # inherited from the environment as set
    assert bind(make_spec(tmp_path, device="cuda"), 0, cores=[0, 1]) is None
    dev = commands.env_overrides(pair, 0, base_env={}, dev_mode=True)
    assert dev["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in commands.env_overrides(pair, 0, base_env={})
    assert commands.usable_cores() and all(c >= 0 for c in commands.usable_cores())


def test_missing_stack_is_a_one_line_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match="vllm and lmcache not installed"):
        commands.require_stack(cache_on=True)
    with pytest.raises(MissingDependencyError, match="vllm not installed"):
        commands.require_stack(cache_on=False)


# ----------------------------------------------------------------- the pair life cycle


def test_pair_starts_reports_and_stops(tmp_path: Path, fake_python: str) -> None:
    pair = make_pair(make_spec(tmp_path), tmp_path, fake_python)
    with pair:
        assert pair.is_alive() and pair.dead_replicas() == []
        assert len(pair.urls) == 2 and pair.lmcache_url is not None
        assert all(net.http_ok(url + "/health") for url in pair.urls)
        names = [p["role"] for p in pair.processes]
        assert names == ["lmcache", "replica", "replica"]
        replica = pair.processes[1]
        assert replica["argv"][2] == "vllm.entrypoints.openai.api_server"
        assert replica["env"]["VLLM_NO_USAGE_STATS"] == "1" and replica["pgid"] == replica["pid"]
        assert "python" in replica["versions"]
        records = pair.records
    assert_all_gone(records)
    assert all(net.port_is_free(rec.port) for rec in records)
    assert (tmp_path / "logs" / "replica-1.log").read_text().startswith("# sessiongen: ")


def test_cache_off_starts_no_lmcache(tmp_path: Path, fake_python: str) -> None:
    spec = make_spec(tmp_path, replicas=1)
    with ManagedPair(spec, "tiny", False, tmp_path, python=fake_python) as pair:
        assert [rec.role for rec in pair.records] == ["replica"]
        assert "--kv-transfer-config" not in pair.records[0].argv
        assert pair.lmcache_url is None


def test_taken_port_is_refused_before_anything_starts(
    tmp_path: Path, fake_python: str, listener: int
) -> None:
    pair = make_pair(make_spec(tmp_path, base_port=listener), tmp_path, fake_python)
    with pytest.raises(EndpointError, match=f"port {listener} \\(replica-0\\) is already in use"):
        pair.start()
    assert pair.records == [] and not (tmp_path / "logs").exists()
    clash = make_spec(tmp_path, base_port=listener + 1, lmcache_port=listener + 2)
    with pytest.raises(EndpointError, match="requested for both replica-1 and lmcache"):
        make_pair(clash, tmp_path, fake_python).start()


def test_start_fails_fast_with_log_tail_and_leaves_nothing(
    tmp_path: Path, fake_python: str
) -> None:
    base = net.pick_free_port()
    spec = make_spec(tmp_path, base_port=base, env={"FAKE_CRASH_PORT": str(base + 1)})
    pair = make_pair(spec, tmp_path, fake_python)
    started = time.monotonic()
    with pytest.raises(EndpointError) as err:
        pair.start()
    assert time.monotonic() - started < 15
    assert "replica-1" in str(err.value) and "exited with status 3" in str(err.value)
    assert "crashing on purpose" in str(err.value)
    assert_all_gone(pair.records)


def test_start_deadline(tmp_path: Path, fake_python: str) -> None:
    spec = make_spec(tmp_path, startup_timeout_s=1.5, env={"FAKE_MODE": "slow"})
    pair = make_pair(spec, tmp_path, fake_python)
    with pytest.raises(EndpointError, match=r"not healthy within 1.5 s: replica-0 .*, replica-1"):
        pair.start()
    assert_all_gone(pair.records)


def test_crashed_replica_is_reported_and_its_orphans_stopped(
    tmp_path: Path, fake_python: str
) -> None:
    pair = make_pair(make_spec(tmp_path), tmp_path, fake_python)
    with pair:
        victim = pair.records[2]
        os.kill(victim.pid, signal.SIGKILL)  # its forked child survives, as vLLM's would
        time.sleep(0.2)
        assert pair.dead_replicas() == [1] and not pair.is_alive() and pair.lmcache_alive()
        assert procs.group_alive(victim)
        records = pair.records
    assert_all_gone(records)


def test_sigterm_ignoring_servers_are_killed(tmp_path: Path, fake_python: str) -> None:
    spec = make_spec(tmp_path, replicas=1, env={"FAKE_MODE": "stubborn"})
    pair = ManagedPair(spec, "m", False, tmp_path, python=fake_python, stop_grace_s=0.5)
    pair.start()
    assert pair.stop() == {"replica-0": "killed"}
    assert_all_gone(pair.records)
    assert pair.stop() == {"replica-0": "gone"}


def test_stop_from_another_thread_cancels_start(tmp_path: Path, fake_python: str) -> None:
    """As when asyncio cancels a task that runs start() in a thread."""
    spec = make_spec(tmp_path, env={"FAKE_MODE": "slow"})
    pair = make_pair(spec, tmp_path, fake_python)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pair.start()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 20
    while len(pair.records) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pair.stop()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert len(errors) == 1 and "start-up cancelled" in str(errors[0])
    assert len(pair.records) == 3
    assert_all_gone(pair.records)


CTRL_C_SCRIPT = """
import sys
from pathlib import Path
from sessiongen.launch import commands
from sessiongen.launch.pair import ManagedPair
from sessiongen.scenario.spec import ManagedSpec

commands.require_stack = lambda cache_on: None
spec = ManagedSpec(model=sys.argv[3], startup_timeout_s=120, env={"FAKE_MODE": sys.argv[4]})
with ManagedPair(spec, "m", True, Path(sys.argv[2]), python=sys.argv[1],
                 state_file=Path(sys.argv[2]) / "pair.json", stop_grace_s=5):
    print("up", flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize(("mode", "sig"), [("slow", signal.SIGINT), ("ok", signal.SIGTERM)])
def test_interrupt_stops_everything(
    tmp_path: Path, fake_python: str, mode: str, sig: signal.Signals
) -> None:
    """Ctrl-C during start-up, or SIGTERM while running: no process survives."""
    state_file = tmp_path / "pair.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, fake_python, str(tmp_path), str(tmp_path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    records: list[ProcessRecord] = []
    while len(records) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        if state_file.exists():
            records = state.records(json.loads(state_file.read_text()))
    try:
        assert len(records) == 3
        if mode == "ok":
            assert child.stdout is not None and child.stdout.readline() == b"up\n"
        child.send_signal(sig)
        assert child.wait(timeout=20) != 0
        assert_all_gone(records)
        assert not state_file.exists()
    finally:
        child.kill()
        procs.stop_groups(records, grace_s=1)


# ----------------------------------------------------------------- pair down / status


def test_pair_status_and_down_from_another_process(tmp_path: Path, fake_python: str) -> None:
    pair = make_pair(
        make_spec(tmp_path), tmp_path, fake_python, state_file=state.state_path(tmp_path)
    )
    pair.start()
    pair.detach()
    rows = state.pair_status(tmp_path)
    assert [r["name"] for r in rows] == ["lmcache", "replica-0", "replica-1"]
    assert all(r["alive"] and r["healthy"] for r in rows)
    os.kill(pair.records[1].pid, signal.SIGKILL)
    time.sleep(0.2)
    rows = state.pair_status(tmp_path)
    assert rows[1]["alive"] and not rows[1]["healthy"]  # orphaned engine core lingers
    lines = state.pair_down(tmp_path, grace_s=5)
    assert len(lines) == 3 and all(line.endswith(": stopped") for line in lines)
    assert_all_gone(pair.records)
    assert state.pair_status(tmp_path) == [] and state.pair_down(tmp_path) == []


def test_pair_down_never_signals_a_reused_pid(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        rec = ProcessRecord(
            role="replica", index=0, argv=("x",), env={}, pid=sleeper.pid, pgid=sleeper.pid,
            starttime=1, port=1, url="http://127.0.0.1:1", health_url="http://127.0.0.1:1/h",
            log="x.log",
        )  # fmt: skip
        data = {"schema": 1, "boot_id": procs.boot_id(), "processes": [rec.to_dict()]}
        files.atomic_write_json(state.state_path(tmp_path), data)
        assert state.pair_status(tmp_path)[0]["alive"] is False
        assert state.pair_down(tmp_path) == [f"replica-0 (pid {sleeper.pid}, port 1): not ours"]
        assert sleeper.poll() is None
        data["boot_id"] = "another-boot"
        files.atomic_write_json(state.state_path(tmp_path), data)
        assert state.pair_down(tmp_path)[0].endswith("gone (machine rebooted)")
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_pair_up_names_each_process_it_prints(
    tmp_path: Path,
    fake_python: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sessiongen import cli

    scenario = tmp_path / "t.toml"
    scenario.write_text(
        f'name = "t"\n[target]\nkind = "managed"\n[target.managed]\nmodel = "{tmp_path}"\n'
        "replicas = 2\nstartup_timeout_s = 30\n"
    )
    monkeypatch.setattr(
        state, "ManagedPair", lambda *a, **kw: ManagedPair(*a, **kw, python=fake_python)
    )
    state_dir = tmp_path / "state"
    cli.main(["pair", "up", str(scenario), "--cache", "on", "--state-dir", str(state_dir)])
    try:
        printed = capsys.readouterr().out.splitlines()
        recorded = state.records(json.loads(state.state_path(state_dir).read_text()))
        assert printed[:3] == [f"{rec.name}: pid {rec.pid} {rec.url}" for rec in recorded]
        assert [line.split(":")[0] for line in printed[:3]] == [
            "lmcache",
            "replica-0",
            "replica-1",
        ]
    finally:
        assert all(line.endswith("stopped") for line in state.pair_down(state_dir))


def test_pair_up_refuses_a_second_pair_and_non_managed_targets(
    tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessiongen import scenario as scenario_mod

    managed = {"model": str(tmp_path), "replicas": 1, "startup_timeout_s": 30}
    raw = {"name": "t", "target": {"kind": "managed", "managed": managed}}
    scn = scenario_mod.from_dict(raw, source="t.toml")
    with pytest.raises(ScenarioError, match=r't\.toml: target\.kind: pair up needs "managed"'):
        state.pair_up(scenario_mod.from_dict({"name": "t"}, source="t.toml"), tmp_path)
    monkeypatch.setattr(
        state, "ManagedPair", lambda *a, **kw: ManagedPair(*a, **kw, python=fake_python)
    )
    up = state.pair_up(scn, tmp_path, cache_on=False)
    try:
        assert up["scenario_name"] == "t" and len(up["processes"]) == 1
        assert json.loads(state.state_path(tmp_path).read_text()) == up
        with pytest.raises(EndpointError, match="already up"):
            state.pair_up(scn, tmp_path, cache_on=False)
    finally:
        assert state.pair_down(tmp_path)[0].endswith("stopped")
