"""vllm-router in front of running replicas: its command line, start-up and stop.

:class:`ManagedRouter` starts ``python -m vllm_router.launch_router`` (the ``vllm-router``
console script's module, run with sessiongen's own interpreter so the manifest's version
is the one that ran) in its own process group, waits on ``GET /readiness``, and stops
the group. Facts about vllm-router 0.1.17 the command line relies on, measured here:

- It binds its port only after the workers answer ``/health``, polling every
  ``--worker-startup-check-interval`` (default 30 s, which turned a 1 s start into 31 s
  when a worker came up late): 1 s here. The replicas are healthy before it starts.
- Its Prometheus exporter cannot be turned off and defaults to port 29000; a taken port
  kills it at start, so every router gets a free one of its own.
- Retries are on by default (5 attempts, to any worker): a retried turn would move or
  repeat behind the measurement's back, so ``--disable-retries`` unless the scenario
  asks for them.
- ``--request-timeout-secs`` caps a whole request, stream included (default 1800 s).
- ``--log-level warning`` does not silence its per-request INFO lines; ``RUST_LOG=warn``
  does.
- The process renames itself ``vllm::router``; stopping the process group reaches it
  whatever wraps it. SIGTERM closes the port at once and waits for open streams.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sessiongen.errors import EndpointError, MissingDependencyError
from sessiongen.infra import net, procs, signals
from sessiongen.launch.procs import ProcessRecord
from sessiongen.scenario.routerspec import RouterSpec

ROUTER_MODULE = "vllm_router.launch_router"
ROUTER_DISTRIBUTION = "vllm-router"
INSTALL_HINT = "scripts/install-router.sh, or pip install -r requirements-router.txt"
ROUTER_ENV: dict[str, str] = {"RUST_LOG": "warn"}
"""Set for the router: only warnings and errors in its log (INFO is a line per request)."""

_STOP_GRACE_S = 10.0


def require_router() -> None:
    """Raise :class:`MissingDependencyError` unless vllm-router is installed here."""
    if importlib.util.find_spec("vllm_router") is None:
        raise MissingDependencyError(
            f"router placements: vllm-router is not installed in this environment ({INSTALL_HINT})"
        )


def router_version() -> str | None:
    """The installed vllm-router's version, or None."""
    try:
        return importlib.metadata.version(ROUTER_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def router_argv(
    python: str,
    spec: RouterSpec,
    *,
    policy: str,
    worker_urls: Sequence[str],
    host: str,
    port: int,
    prometheus_port: int,
) -> list[str]:
    """The command line of one router with ``policy`` in front of ``worker_urls``."""
    argv = [
        python, "-m", ROUTER_MODULE,
        "--host", host,
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-host", host,
        "--prometheus-port", str(prometheus_port),
        "--worker-startup-check-interval", "1",
        "--request-timeout-secs", str(max(1, round(spec.request_timeout_s))),
    ]  # fmt: skip
    if not spec.retries:
        argv.append("--disable-retries")
    return argv + list(spec.args)


class ManagedRouter:
    """One vllm-router process group, from :meth:`start` to :meth:`stop`."""

    def __init__(
        self,
        policy: str,
        worker_urls: Sequence[str],
        spec: RouterSpec,
        log_path: Path,
        *,
        python: str = sys.executable,
    ) -> None:
        self.policy = policy
        self.worker_urls = list(worker_urls)
        self.spec = spec
        self.log_path = Path(log_path)
        self._python = python
        self._child: subprocess.Popen[bytes] | None = None
        self._record: ProcessRecord | None = None
        self.startup_s: float | None = None
        # Guards spawning against a concurrent stop() (say, from an asyncio task whose
        # start() in a thread was cancelled): once stopping, nothing new starts.
        self._lock = threading.Lock()
        self._stopping = False
        self._started = False

    @property
    def url(self) -> str:
        """The router's base URL (after :meth:`start`)."""
        if self._record is None:
            raise RuntimeError("router not started")
        return self._record.url

    def start(self) -> None:
        """Start the router and wait until ``/readiness`` answers and sees every worker.

        Raises :class:`MissingDependencyError` when vllm-router is absent and
        :class:`EndpointError` when it exits, misses ``spec.startup_timeout_s`` or is
        stopped meanwhile (:meth:`stop` from another thread); then nothing is left running.
        """
        require_router()
        if self._started:
            raise RuntimeError("ManagedRouter.start() called twice")
        self._started = True
        port = net.pick_free_port()
        metrics_port = net.pick_free_port(avoid={port})
        argv = router_argv(
            self._python,
            self.spec,
            policy=self.policy,
            worker_urls=self.worker_urls,
            host=net.HOST,
            port=port,
            prometheus_port=metrics_port,
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self._lock, signals.deferred():  # no interrupt between spawning and holding
            self._check_not_stopping()
            child = procs.spawn(argv, ROUTER_ENV, self.log_path)
            self._child = child
        atexit.register(self.stop)
        url = f"http://{net.HOST}:{port}"
        self._record = ProcessRecord(
            role="router",
            index=0,
            argv=tuple(argv),
            env=dict(ROUTER_ENV),
            pid=child.pid,
            pgid=child.pid,
            starttime=procs.proc_starttime(child.pid),
            port=port,
            url=url,
            health_url=url + "/readiness",
            log=str(self.log_path),
            extra={"policy": self.policy, "prometheus_port": metrics_port},
        )
        try:
            net.wait_healthy(
                [url + "/readiness"],
                began + self.spec.startup_timeout_s,
                poll_s=0.1,
                check=self._check_running,
                labels=[f"vllm-router ({self.policy})"],
                within=f"{self.spec.startup_timeout_s:g} s",
                note=f"log {self.log_path}",
            )
            self._check_workers(url)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began

    def _check_not_stopping(self) -> None:
        if self._stopping:
            raise EndpointError(f"vllm-router ({self.policy}): start-up cancelled, it is stopping")

    def _check_running(self) -> None:
        self._check_not_stopping()
        child = self._child
        if child is not None and child.poll() is not None:
            raise EndpointError(
                f"vllm-router ({self.policy}) exited with status {child.returncode} during "
                f"start-up; log {self.log_path}, last lines:\n{procs.log_tail(self.log_path)}"
            )

    def _check_workers(self, url: str) -> None:
        """Readiness needs one healthy worker; a measurement needs them all."""
        state = net.http_json(url + "/readiness")
        healthy = state.get("healthy_workers") if isinstance(state, dict) else None
        if healthy != len(self.worker_urls):
            raise EndpointError(
                f"vllm-router at {url}: {healthy} of {len(self.worker_urls)} workers healthy "
                f"at start; log {self.log_path}"
            )

    def stop(self) -> str:
        """Stop the router's process group (SIGTERM, then SIGKILL); idempotent.

        Returns the outcome (see :func:`sessiongen.infra.procs.stop_groups`).
        """
        atexit.unregister(self.stop)
        with self._lock:
            self._stopping = True
            child, self._child = self._child, None
        if child is None:
            return "gone"
        return procs.stop_child("router", child, _STOP_GRACE_S)

    def facts(self) -> dict[str, Any]:
        """What ran, for the manifest: policy, workers, argv, env, pid, port, log, version."""
        rec = self._record.to_dict() if self._record is not None else {}
        return {
            **rec,
            "policy": self.policy,
            "worker_urls": self.worker_urls,
            "startup_s": self.startup_s,
            "version": router_version(),
        }
