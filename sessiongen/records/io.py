"""Run records: ``runs/<run-id>/`` with a JSON manifest and Parquet tables.

A run folder holds:

- ``manifest.json``: schema version, the resolved scenario, seed and salt, tokenizer and
  text-generator identity, tool version and git SHA, the target (sim profile and time
  scale, or endpoints with their /version and /v1/models, or managed processes), host
  facts, block order, start/end times, ``complete``.
- ``requests.parquet``: one row per request (:data:`REQUEST_SCHEMA`).
- ``metrics.parquet``: server counter snapshots per replica and block
  (:data:`METRICS_SCHEMA`).

Durations in ``requests.parquet`` are measured wall seconds. For simulated targets the
manifest's ``target.time_scale`` (wall seconds per modeled second) converts them to
modeled seconds: ``modeled = measured / time_scale``. Real targets have time_scale 1.

Rows are appended as they complete, in batches; every flush rewrites the Parquet file
atomically (temp file + rename), so a crash leaves a readable file and a manifest with
``complete: false``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from sessiongen import __version__
from sessiongen.errors import RunDirError

SCHEMA_VERSION = 1

#: One row per request. Nullable unless noted; ``*_s`` are wall seconds.
REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String(),
    "block": pl.Int32(),  # block index in execution order, 0-based, across placements
    "block_in_placement": pl.Int32(),  # 0..len(design.blocks)-1 within its placement
    "placement": pl.String(),  # alternate | fixed | random | move-at:K
    "cache": pl.String(),  # off | on
    "session_id": pl.String(),
    "session_index": pl.Int32(),
    "context_tokens": pl.Int64(),  # the session's initial context size (a grouping key)
    "turn": pl.Int32(),  # 1-based
    "replica": pl.Int32(),
    "cross_replica": pl.Boolean(),  # previous turn of this session ran on another replica
    "warmup": pl.Boolean(),  # warm-up request: excluded from results
    "prompt_tokens": pl.Int64(),  # server usage
    "content_tokens": pl.Int64(),  # client count of message-content tokens
    "cached_tokens": pl.Int64(),  # server usage.prompt_tokens_details.cached_tokens
    "completion_tokens": pl.Int64(),  # server usage
    "output_chunks": pl.Int64(),  # content deltas received
    "queue_s": pl.Float64(),  # waited for a concurrency slot before send
    "ttfb_s": pl.Float64(),  # send -> first response byte
    "ttft_s": pl.Float64(),  # send -> first non-empty content delta
    "e2e_s": pl.Float64(),  # send -> end of stream
    "itl_p50_s": pl.Float64(),  # median gap between content deltas
    "itl_max_s": pl.Float64(),
    "send_s": pl.Float64(),  # send time, seconds since run start
    "status": pl.String(),  # ok | http_error | connect_error | stream_error | timeout | ...
    "http_status": pl.Int32(),
    "error": pl.String(),
    "local_hit_tokens": pl.Int64(),  # /metrics delta, null where not attributable
    "external_hit_tokens": pl.Int64(),
    "expected": pl.String(),  # needle answer, or null
    "answer_correct": pl.Boolean(),  # needle graded, or null
    "output_digest": pl.String(),  # digest of output token ids (or text)
    "output_text": pl.String(),  # the answer (first 200 characters)
    "first_logprob": pl.Float64(),  # logprob of the first output token, when asked
    "loop_lag_flag": pl.Boolean(),  # event-loop lag > 5 ms while in flight
}

#: Counter snapshots: one row per (block, replica, moment, metric).
METRICS_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String(),
    "block": pl.Int32(),
    "placement": pl.String(),
    "cache": pl.String(),
    "replica": pl.Int32(),
    "moment": pl.String(),  # before | after
    "metric": pl.String(),
    "value": pl.Float64(),
}


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_parquet(path: Path, frame: pl.DataFrame) -> None:
    """Write a Parquet file atomically (temp file + rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def frame_of(rows: Iterable[Mapping[str, Any]], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Rows as a frame with exactly ``schema``'s columns (missing values become null)."""
    cols: dict[str, list[Any]] = {name: [] for name in schema}
    for row in rows:
        for name in schema:
            cols[name].append(row.get(name))
    return pl.DataFrame(cols, schema=dict(schema))


class TableWriter:
    """Accumulates rows and rewrites one Parquet file atomically on :meth:`flush`.

    The caller decides when (``due`` says a batch is full), so an async caller can flush
    in a worker thread and keep its event loop free.
    """

    def __init__(self, path: Path, schema: Mapping[str, pl.DataType], batch: int = 64) -> None:
        self.path = path
        self.schema = schema
        self.batch = batch
        self._rows: list[Mapping[str, Any]] = []
        self._unflushed = 0
        self._lock = threading.Lock()

    def add(self, row: Mapping[str, Any]) -> None:
        """Keep a row (in memory; :meth:`flush` writes)."""
        with self._lock:
            self._rows.append(row)
            self._unflushed += 1

    @property
    def due(self) -> bool:
        """True when a full batch waits to be written."""
        return self._unflushed >= self.batch

    def flush(self) -> None:
        """Write everything kept so far."""
        with self._lock:
            rows = list(self._rows)
            self._unflushed = 0
        atomic_write_parquet(self.path, frame_of(rows, self.schema))


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


def host_facts() -> dict[str, Any]:
    """Facts about the client host worth keeping beside measurements."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }


def tool_identity() -> dict[str, Any]:
    """sessiongen's version and git SHA."""
    return {"sessiongen_version": __version__, "git_sha": git_sha()}


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` atomically."""
    data = orjson.dumps(dict(manifest), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    atomic_write_bytes(run_dir / "manifest.json", data + b"\n")


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Read a run's manifest; a one-line :class:`RunDirError` when missing or broken."""
    path = Path(run_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{path}: no manifest (is this a run folder?)") from None
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise RunDirError(f"{path}: schema_version: expected {SCHEMA_VERSION}")
    return data


def read_requests(run_dir: Path) -> pl.DataFrame:
    """Read ``requests.parquet`` of a run folder."""
    path = Path(run_dir) / "requests.parquet"
    if not path.is_file():
        raise RunDirError(f"{path}: missing")
    return pl.read_parquet(path)


def time_scale(manifest: Mapping[str, Any]) -> float:
    """Wall seconds per modeled second for this run (1.0 for real targets)."""
    return float(manifest.get("target", {}).get("time_scale", 1.0))


def now_iso() -> str:
    """Current UTC time in ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")
