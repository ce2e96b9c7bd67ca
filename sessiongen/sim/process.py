"""Running the simulated replicas: in this process (``serve``) or in a child (``start_sim``).

``serve`` runs every replica of one profile on one event loop until interrupted; it is
what ``sessiongen sim serve`` and ``python -m sessiongen.sim`` call. ``start_sim`` starts
``python -m sessiongen.sim`` in its own process group, so the simulator's work never
runs on the caller's event loop, and returns a :class:`SimHandle` once every replica
answers ``/health``. The child binds port 0 and reports its URLs as one JSON line on
stdout (no port races), and exits when its stdin closes, so it cannot outlive a caller
that dies without cleaning up. ``stop`` (also on context exit and at interpreter exit)
sends SIGTERM to the group, then SIGKILL after a deadline.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from aiohttp import web

from sessiongen.errors import EndpointError
from sessiongen.infra import net, procs
from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.engine import World
from sessiongen.sim.server import build_app

log = logging.getLogger("sessiongen.sim")


async def _run(
    world: World,
    base_port: int,
    host: str,
    on_ready: Callable[[list[str]], None] | None,
    stop_on_stdin_eof: bool,
) -> None:
    runners: list[web.AppRunner] = []
    urls: list[str] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        for replica in world.replicas:
            runner = web.AppRunner(build_app(replica), access_log=None)
            await runner.setup()
            runners.append(runner)
            port = base_port + replica.index if base_port else 0
            await web.TCPSite(runner, host, port).start()
            urls.append(f"http://{host}:{runner.addresses[0][1]}")
        for i, url in enumerate(urls):
            log.info("replica %d serving %s at %s", i, world.model_name, url)
        if on_ready is not None:
            on_ready(urls)
        if stop_on_stdin_eof:
            loop.add_reader(sys.stdin.fileno(), _on_stdin, stop)
        await stop.wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def _on_stdin(stop: asyncio.Event) -> None:
    if not os.read(sys.stdin.fileno(), 4096):
        stop.set()


def serve(
    profile: SimProfile,
    model_name: str,
    base_port: int,
    shared_cache: bool,
    host: str = "127.0.0.1",
    *,
    on_ready: Callable[[list[str]], None] | None = None,
    stop_on_stdin_eof: bool = False,
) -> None:
    """Serve ``profile.replicas`` replicas on ``base_port + i`` (0: free ports) until
    SIGINT/SIGTERM. ``on_ready`` receives the URLs once every replica listens."""
    # Worker threads (tokenizing, hashing) hand the GIL back to the event loop's timers
    # within 0.5 ms instead of the default 5 ms.
    sys.setswitchinterval(0.0005)
    world = World(profile, model_name, shared_cache)
    asyncio.run(_run(world, base_port, host, on_ready, stop_on_stdin_eof))


class SimHandle:
    """A running simulator subprocess: its replicas' URLs and how to stop it."""

    def __init__(self, proc: subprocess.Popen[bytes], urls: list[str], log_file: IO[bytes] | None):
        self.proc = proc
        self.urls = urls
        self._log_file = log_file
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def post(self, replica: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a JSON body to one replica's admin route (e.g. ``/sim/reset``)."""
        return _post_json(self.urls[replica] + path, body)

    def reset(self, pool: bool = False) -> None:
        """Empty every replica's prefix cache, and the shared pool if ``pool``."""
        for i in range(len(self.urls)):
            self.post(i, "/sim/reset", {"pool": pool and i == 0})

    def set_shared_cache(self, on: bool) -> None:
        """Switch the shared pool on or off for all replicas."""
        self.post(0, "/sim/config", {"shared_cache": on})

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the process group: SIGTERM, then SIGKILL after ``timeout_s``."""
        atexit.unregister(self.stop)
        procs.stop_child("sim", self.proc, timeout_s)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _post_json(url: str, body: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def _read_line(proc: subprocess.Popen[bytes], deadline: float) -> bytes:
    """The child's first stdout line, or b"" if it exits or the deadline passes."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return b""
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return b""
            buf += chunk
    return buf


def start_sim(
    profile: SimProfile,
    model_name: str,
    shared_cache: bool,
    *,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 60.0,
) -> SimHandle:
    """Start the simulated replicas in a subprocess on free ports; return once healthy.

    Per-request log lines go to ``log_path`` when given; otherwise only warnings reach
    this process's stderr. Use as a context manager, or call ``stop()``.
    """
    cmd = [
        sys.executable, "-m", "sessiongen.sim",
        "--port", "0",
        "--model", model_name,
        "--shared-cache", "on" if shared_cache else "off",
        "--profile-json", json.dumps(to_plain(profile)),
        "--report-urls",
        "--exit-on-stdin-eof",
        "--log-level", "INFO" if log_path is not None else "WARNING",
    ]  # fmt: skip
    log_file = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log_file,
        env=env,
        start_new_session=True,
    )
    handle = SimHandle(proc, [], log_file)
    try:
        deadline = time.monotonic() + startup_timeout_s
        line = _read_line(proc, deadline)
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
            code = proc.poll()
            why = f"exited with status {code}" if code is not None else "did not report its ports"
            raise EndpointError(f"simulated replicas: python -m sessiongen.sim {why}")
        handle.urls = list(json.loads(line)["urls"])
        net.wait_healthy(
            [url + "/health" for url in handle.urls],
            deadline,
            poll_s=0.05,
            within=f"{startup_timeout_s:g} s",
        )
    except BaseException:
        handle.stop()
        raise
    return handle
