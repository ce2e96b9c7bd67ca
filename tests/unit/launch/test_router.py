"""vllm-router's launcher with a fake router: command line, start-up, failures, stopping.

A fake "python" takes the router's command line and serves ``/readiness`` the way
vllm-router 0.1.17 does (``{"status": "ready", "healthy_workers": N, ...}``), so start-up,
the all-workers check, a crash at start and stopping the group run without vllm-router.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from sessiongen.errors import EndpointError, MissingDependencyError
from sessiongen.infra import procs
from sessiongen.launch import commands
from sessiongen.launch import router as router_mod
from sessiongen.launch.router import ManagedRouter, router_argv
from sessiongen.scenario.routerspec import RouterSpec
from sessiongen.scenario.spec import ManagedSpec

FAKE_ROUTER = textwrap.dedent(
    """
    import http.server, json, os, sys, time

    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    start = args.index("--worker-urls") + 1
    workers = []
    while start < len(args) and not args[start].startswith("--"):
        workers.append(args[start])
        start += 1
    if os.environ.get("FAKE_ROUTER") == "crash":
        print("fake router: no workers reachable", flush=True)
        sys.exit(4)
    if os.environ.get("FAKE_ROUTER") == "slow":  # never ready
        time.sleep(600)
    healthy = int(os.environ.get("FAKE_HEALTHY", len(workers)))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ready", "healthy_workers": healthy,
                               "total_workers": len(workers)}).encode()
            self.send_response(200 if self.path == "/readiness" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)
WORKERS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


@pytest.fixture
def fake_router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    script = tmp_path / "fake_router.py"
    script.write_text(FAKE_ROUTER)
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(router_mod, "require_router", lambda: None)
    return str(wrapper)


def test_router_argv_disables_retries_and_names_every_port() -> None:
    argv = router_argv(
        "py",
        RouterSpec(args=("--cache-threshold", "0.5")),
        policy="cache_aware",
        worker_urls=WORKERS,
        host="127.0.0.1",
        port=9000,
        prometheus_port=9001,
    )
    assert argv[:3] == ["py", "-m", "vllm_router.launch_router"]
    joined = " ".join(argv)
    assert f"--worker-urls {' '.join(WORKERS)} --policy cache_aware" in joined
    assert "--prometheus-port 9001" in joined and "--port 9000" in joined
    assert "--worker-startup-check-interval 1" in joined
    assert "--disable-retries" in argv and argv[-2:] == ["--cache-threshold", "0.5"]
    retrying = router_argv(
        "py",
        RouterSpec(retries=True),
        policy="random",
        worker_urls=WORKERS,
        host="h",
        port=1,
        prometheus_port=2,
    )
    assert "--disable-retries" not in retrying


def test_missing_router_is_a_one_line_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match="vllm-router is not installed"):
        router_mod.require_router()


def test_router_starts_reports_and_stops(tmp_path: Path, fake_router: str) -> None:
    router = ManagedRouter(
        "round_robin", WORKERS, RouterSpec(), tmp_path / "r.log", python=fake_router
    )
    router.start()
    try:
        facts = router.facts()
        assert router.url == facts["url"] and facts["policy"] == "round_robin"
        assert facts["env"] == {"RUST_LOG": "warn"} and facts["worker_urls"] == WORKERS
        pgid = facts["pgid"]
        assert procs.group_members(pgid)
    finally:
        assert router.stop() == "stopped"
    assert procs.group_members(pgid) == []
    assert router.stop() == "gone"  # idempotent


def test_router_that_exits_at_start_fails_with_its_log(
    tmp_path: Path, fake_router: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ROUTER", "crash")
    router = ManagedRouter("random", WORKERS, RouterSpec(), tmp_path / "r.log", python=fake_router)
    with pytest.raises(EndpointError, match=r"(?s)exited with status 4.*no workers reachable"):
        router.start()


def test_router_must_see_every_worker(
    tmp_path: Path, fake_router: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HEALTHY", "1")
    router = ManagedRouter("random", WORKERS, RouterSpec(), tmp_path / "r.log", python=fake_router)
    with pytest.raises(EndpointError, match="1 of 2 workers healthy"):
        router.start()
    pgid = router.facts()["pgid"]
    assert procs.group_members(pgid) == []  # nothing left running


def test_vllm_replicas_name_themselves_in_system_fingerprint(tmp_path: Path) -> None:
    spec = ManagedSpec(model=str(tmp_path))
    common = dict(model_arg="/m", dummy_weights=False, served_name="tiny", host="h", port=1)
    argv = commands.vllm_argv("py", spec, lmcache_port=None, fingerprint="r-1", **common)
    assert " ".join(argv).endswith("--fingerprint-mode custom --fingerprint-value r-1")
    plain = commands.vllm_argv("py", spec, lmcache_port=None, **common)
    assert "--fingerprint-mode" not in plain
    own = ManagedSpec(model=str(tmp_path), vllm_args=("--fingerprint-mode", "none"))
    argv = commands.vllm_argv("py", own, lmcache_port=None, fingerprint="r-1", **common)
    assert argv.count("--fingerprint-mode") == 1  # the user's choice stands


def test_fingerprint_support_is_probed_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Spec:
        submodule_search_locations: ClassVar[list[str]] = [str(tmp_path / "vllm")]

    source = tmp_path / "vllm" / "entrypoints" / "serve" / "utils" / "fingerprint.py"
    monkeypatch.setattr(commands.importlib.util, "find_spec", lambda name: Spec())
    commands.fingerprint_supported.cache_clear()
    try:
        assert commands.fingerprint_supported() is False  # an older vLLM: no such module
        commands.fingerprint_supported.cache_clear()
        source.parent.mkdir(parents=True)
        source.write_text('Mode = Literal["full", "hash", "custom", "none"]\n')
        assert commands.fingerprint_supported() is True
    finally:
        commands.fingerprint_supported.cache_clear()


def test_a_router_stopped_while_it_starts_leaves_nothing(
    tmp_path: Path, fake_router: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay interrupted while a block's router starts: start() runs in a worker
    thread, stop() comes from the event loop's thread; both return, nothing is left."""
    monkeypatch.setenv("FAKE_ROUTER", "slow")
    spec = RouterSpec(startup_timeout_s=600)
    router = ManagedRouter("random", WORKERS, spec, tmp_path / "r.log", python=fake_router)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            router.start()
        except EndpointError as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    deadline = time.monotonic() + 30
    while router.facts().get("pgid") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    pgid = router.facts()["pgid"]
    assert router.stop() in ("stopped", "killed")
    thread.join(timeout=30)  # the start-up wait gives up, it does not wait 600 s
    assert not thread.is_alive()
    assert len(errors) == 1 and "start-up cancelled" in str(errors[0])
    assert procs.group_members(pgid) == []


def test_a_router_stopped_before_it_starts_never_runs(tmp_path: Path, fake_router: str) -> None:
    """The same race the other way round: stop() got there before start() spawned."""
    router = ManagedRouter("random", WORKERS, RouterSpec(), tmp_path / "r.log", python=fake_router)
    router.stop()
    with pytest.raises(EndpointError, match="start-up cancelled"):
        router.start()
    assert not (tmp_path / "r.log").exists()  # nothing was spawned
