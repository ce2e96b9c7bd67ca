"""Running the simulated replicas: in this process (``serve``) or in a child (``start_sim``).

``serve`` runs every replica of one profile on one event loop until SIGINT, SIGTERM or
SIGHUP; it is what ``sessiongen sim serve`` and ``python -m sessiongen.sim`` call. Told
to stop, it gives requests in flight :data:`SHUTDOWN_GRACE_S` and exits; a second
signal exits at once. (aiohttp's default grace is 60 s per connection, and the replicas
share one engine whose clock stops with the first replica's clean-up: a stopped
simulator with a request in flight on another replica stayed up for over a minute,
deaf to SIGTERM, and spun on its closed stdin at 95% of a core, measured here.)

``launch_sim`` starts ``python -m sessiongen.sim`` in its own process group and returns
its :class:`SimHandle` at once, so that whoever will stop it holds it before it is
ready; :meth:`SimHandle.wait_ready` then waits until every replica answers
``/health`` (``start_sim`` does both). The child binds port 0 and reports its URLs as
one JSON line on stdout (no port races). It watches its stdin from its first moment
and exits when it closes: the pipe closes whenever the parent process ends, SIGKILL
included, so the simulator never outlives its caller (a parent-death signal,
``PR_SET_PDEATHSIG``, would follow the thread that started the child, not the
process). ``stop`` (also on context exit and at interpreter exit) sends SIGTERM to the
group, then SIGKILL after a deadline.
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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from aiohttp import web

from sessiongen.errors import EndpointError
from sessiongen.infra import net, procs, signals
from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.engine import World
from sessiongen.sim.server import build_app

log = logging.getLogger("sessiongen.sim")


#: Seconds that requests in flight get to finish once the simulator is told to stop,
#: before they are cancelled: whoever stops it no longer waits for their answers.
SHUTDOWN_GRACE_S = 1.0

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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

    def on_signal(signum: int) -> None:
        if stop.is_set():  # asked again while stopping: leave now
            os._exit(128 + signum)
        stop.set()

    for sig in signals.answered(_STOP_SIGNALS):
        loop.add_signal_handler(sig, on_signal, sig)
    if stop_on_stdin_eof:  # before anything else: a caller gone during start-up counts
        loop.add_reader(sys.stdin.fileno(), _on_stdin, loop, stop)
    try:
        for replica in world.replicas:
            app = build_app(replica)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
            await runner.setup()
            runners.append(runner)
            port = base_port + replica.index if base_port else 0
            await web.TCPSite(runner, host, port).start()
            urls.append(f"http://{host}:{runner.addresses[0][1]}")
        for i, url in enumerate(urls):
            log.info("replica %d serving %s at %s", i, world.model_name, url)
        if on_ready is not None and not stop.is_set():
            on_ready(urls)
        await stop.wait()
    finally:
        # All replicas at once: the grace is paid once, not once per replica.
        await asyncio.gather(*(runner.cleanup() for runner in runners))


def _on_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    fd = sys.stdin.fileno()
    try:
        data = os.read(fd, 4096)
    except OSError:
        data = b""
    if not data:  # closed: stop, and stop watching (EOF stays readable: it would spin)
        loop.remove_reader(fd)
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
    SIGINT, SIGTERM or SIGHUP (or, with ``stop_on_stdin_eof``, until stdin closes).
    ``on_ready`` receives the URLs once every replica listens."""
    # Worker threads (tokenizing, hashing) hand the GIL back to the event loop's timers
    # within 0.5 ms instead of the default 5 ms.
    sys.setswitchinterval(0.0005)
    world = World(profile, model_name, shared_cache)
    asyncio.run(_run(world, base_port, host, on_ready, stop_on_stdin_eof))


class SimHandle:
    """A simulator subprocess: its replicas' URLs (once ready) and how to stop it.

    :meth:`stop` may be called from any thread, also while another waits in
    :meth:`wait_ready` (which then gives up within :data:`_POLL_S`).
    """

    def __init__(self, proc: subprocess.Popen[bytes], log_file: IO[bytes] | None) -> None:
        self.proc = proc
        self.urls: list[str] = []
        self._log_file = log_file
        self._stopping = False
        self._stopped = False
        self._stop_lock = threading.Lock()  # one stop at a time; the others wait for it
        self._io_lock = threading.Lock()  # held while wait_ready reads the child's stdout
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

    def wait_ready(self, startup_timeout_s: float = 60.0) -> None:
        """Wait until the child reports its URLs and every replica answers ``/health``.

        Raises :class:`EndpointError` when it exits, misses the deadline or is stopped
        meanwhile; it is stopped then, whatever the error.
        """
        try:
            deadline = time.monotonic() + startup_timeout_s
            with self._io_lock:
                line = _read_line(self.proc, deadline, lambda: self._stopping)
            if not line:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(min(1.0, max(deadline - time.monotonic(), 0.0)))
                raise EndpointError(f"simulated replicas: python -m sessiongen.sim {self._why()}")
            self.urls = list(json.loads(line)["urls"])
            net.wait_healthy(
                [url + "/health" for url in self.urls],
                deadline,
                poll_s=0.05,
                check=self._check_starting,
                within=f"{startup_timeout_s:g} s",
            )
        except BaseException:
            self.stop()
            raise

    def _why(self) -> str:
        code = self.proc.poll()
        if self._stopping:
            return "start-up cancelled: it is being stopped"
        return f"exited with status {code}" if code is not None else "did not report its ports"

    def _check_starting(self) -> None:
        if self._stopping or self.proc.poll() is not None:
            raise EndpointError(f"simulated replicas: python -m sessiongen.sim {self._why()}")

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
        """Stop the process group: SIGTERM, then SIGKILL after ``timeout_s``; idempotent."""
        atexit.unregister(self.stop)
        self._stopping = True
        with self._stop_lock:
            if self._stopped:
                return
            procs.stop_child("sim", self.proc, timeout_s)
            with self._io_lock:  # the child is gone: a reader of its stdout has seen EOF
                for pipe in (self.proc.stdin, self.proc.stdout):
                    if pipe is not None:
                        pipe.close()
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            self._stopped = True


def _post_json(url: str, body: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


#: Seconds between looks at whether a start-up wait was cancelled.
_POLL_S = 0.1


def _read_line(
    proc: subprocess.Popen[bytes], deadline: float, cancelled: Callable[[], bool]
) -> bytes:
    """The child's first stdout line, or b"" if it exits, the deadline passes or
    ``cancelled()`` turns true."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or cancelled():
                return b""
            if not sel.select(min(left, _POLL_S)):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return b""
            buf += chunk
    return buf


def launch_sim(
    profile: SimProfile,
    model_name: str,
    shared_cache: bool,
    *,
    log_path: str | Path | None = None,
) -> SimHandle:
    """Start the simulated replicas in a subprocess on free ports; return at once.

    The handle exists before the child has done anything, so that a caller interrupted
    while it starts can stop it; :meth:`SimHandle.wait_ready` waits for it. Per-request
    log lines go to ``log_path`` when given; otherwise only warnings reach this
    process's stderr.
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
    with signals.deferred():  # started and held in one step
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
            start_new_session=True,
        )
        return SimHandle(proc, log_file)


def start_sim(
    profile: SimProfile,
    model_name: str,
    shared_cache: bool,
    *,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 60.0,
) -> SimHandle:
    """Start the simulated replicas in a subprocess on free ports; return once healthy.

    :func:`launch_sim` then :meth:`SimHandle.wait_ready`. Use as a context manager, or
    call ``stop()``.
    """
    handle = launch_sim(profile, model_name, shared_cache, log_path=log_path)
    handle.wait_ready(startup_timeout_s)
    return handle
