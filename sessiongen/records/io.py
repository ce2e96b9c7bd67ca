"""Writing and reading a run folder (formats in :mod:`sessiongen.records.format`).

Records are appended as requests complete and written in batches: every flush rewrites
the Parquet file atomically (temp file + rename, :mod:`sessiongen.infra.files`), so a
crash leaves a readable file and a manifest with ``complete: false``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, TypeVar, cast

import polars as pl

from sessiongen._version import __version__
from sessiongen.errors import RunDirError
from sessiongen.infra.files import atomic_write, atomic_write_json
from sessiongen.records.format import (
    SCHEMA_VERSION,
    HostFacts,
    Manifest,
    ToolIdentity,
    frame_of_records,
)
from sessiongen.records.meta import RunMeta

R = TypeVar("R")

#: Manifest schema versions this code reads.
READABLE_VERSIONS = (1, 2, 3, 4)


def atomic_write_parquet(path: Path, frame: pl.DataFrame) -> None:
    """Write a Parquet file atomically (temp file + rename)."""
    atomic_write(path, frame.write_parquet)


class TableWriter(Generic[R]):
    """Keeps records of one class and rewrites one Parquet file atomically on :meth:`flush`.

    The caller decides when (``due`` says a batch is full), so an async caller can flush
    in a worker thread and keep its event loop free.
    """

    def __init__(self, path: Path, record_class: type[R], batch: int = 64) -> None:
        self.path = path
        self.record_class = record_class
        self.batch = batch
        self._records: list[R] = []
        self._unflushed = 0
        self._lock = threading.Lock()

    def add(self, record: R) -> None:
        """Keep a record (in memory; :meth:`flush` writes)."""
        with self._lock:
            self._records.append(record)
            self._unflushed += 1

    @property
    def due(self) -> bool:
        """True when a full batch waits to be written."""
        return self._unflushed >= self.batch

    def flush(self) -> None:
        """Write everything kept so far."""
        with self._lock:
            records = list(self._records)
            self._unflushed = 0
        atomic_write_parquet(self.path, frame_of_records(records, self.record_class))


def new_run_id(scenario_name: str, now: datetime | None = None) -> str:
    """A run id sortable by time: ``20261130T142501Z-alt128k-3f9a``."""
    now = now or datetime.now(UTC)
    suffix = os.urandom(2).hex()
    return f"{now:%Y%m%dT%H%M%SZ}-{scenario_name}-{suffix}"


def git_sha() -> str | None:
    """The git SHA of the sessiongen checkout, when running from one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else None


def host_facts() -> HostFacts:
    """Facts about the client host worth keeping beside measurements (its GPUs where
    ``nvidia-smi`` answers: the replicas a managed target starts run on them)."""
    facts: HostFacts = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    gpus = _gpus()
    if gpus:
        facts["gpus"] = gpus
    return facts


def _gpus() -> list[str]:
    """One "name, memory, driver" line per NVIDIA GPU, none without ``nvidia-smi``."""
    query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(
            ["nvidia-smi", *query], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return (
        [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if not out.returncode
        else []
    )


def tool_identity() -> ToolIdentity:
    """sessiongen's version and git SHA."""
    return {"sessiongen_version": __version__, "git_sha": git_sha()}


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` atomically."""
    atomic_write_json(run_dir / "manifest.json", manifest)


def read_manifest(run_dir: Path) -> Manifest:
    """Read a run's manifest as JSON; a one-line :class:`RunDirError` when missing or broken.

    Typed as written today; older manifests lack later keys, so readers ``.get`` those
    (:class:`~sessiongen.records.format.RunMeta` parses every version once)."""
    path = Path(run_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{path}: no manifest (is this a run folder?)") from None
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") not in READABLE_VERSIONS:
        readable = ", ".join(map(str, READABLE_VERSIONS))
        raise RunDirError(f"{path}: schema_version: expected one of {readable}")
    return cast(Manifest, data)  # the JSON border: checked for a readable version above


def read_meta(run_dir: Path) -> RunMeta:
    """A run's manifest, parsed (:class:`RunMeta`)."""
    return RunMeta.from_manifest(read_manifest(run_dir), fallback_id=Path(run_dir).name)


def read_requests(run_dir: Path) -> pl.DataFrame:
    """Read ``requests.parquet`` of a run folder; a one-line error when it is broken."""
    path = Path(run_dir) / "requests.parquet"
    if not path.is_file():
        raise RunDirError(f"{path}: missing")
    try:
        return pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise RunDirError(f"{path}: unreadable: {str(exc).splitlines()[0][:160]}") from None


def now_iso() -> str:
    """Current UTC time in ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")


__all__ = [
    "SCHEMA_VERSION",
    "TableWriter",
    "atomic_write_parquet",
    "host_facts",
    "new_run_id",
    "now_iso",
    "read_manifest",
    "read_meta",
    "read_requests",
    "tool_identity",
    "write_manifest",
]
