"""Process groups that sessiongen starts, and the record of them that outlives it.

Every server runs in its own session (so its own process group): vLLM forks an engine
core and workers, and one ``killpg`` reaches all of them, while a Ctrl-C in the terminal
reaches only sessiongen, which then stops the groups in order. A :class:`ProcessRecord`
holds what a later ``sessiongen pair down`` needs to find the same groups again, and what
a run manifest needs to say what ran (argv, environment overrides, port, log).

Linux only, like vLLM: liveness comes from ``/proc``, because a group whose leader died
can keep orphaned members, and zombies must not count as alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class ProcessRecord:
    """One started server process group: how it was started and how to find it again."""

    role: str
    """``"lmcache"`` or ``"replica"``."""
    index: int
    """Replica index (0 for the LMCache server)."""
    argv: tuple[str, ...]
    env: dict[str, str]
    """Only the variables sessiongen set on top of its own environment."""
    pid: int
    pgid: int
    starttime: int | None
    """Start time of the leader in clock ticks since boot (``/proc/PID/stat``), to tell
    our process from a later one that reuses its pid."""
    port: int
    url: str
    """Base URL (replicas: the OpenAI API; LMCache: its HTTP API)."""
    health_url: str
    log: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Short display name: ``lmcache`` or ``replica-N``."""
        return self.role if self.role == "lmcache" else f"{self.role}-{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (state file, manifest)."""
        data = asdict(self)
        data["argv"] = list(self.argv)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRecord:
        """Inverse of :meth:`to_dict`."""
        fields = dict(data)
        fields["argv"] = tuple(fields["argv"])
        return cls(**fields)


def spawn(
    argv: Sequence[str], env_overrides: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``.

    The log starts with a header line naming the command, so a log read on its own says
    what produced it.
    """
    env = {**os.environ, **env_overrides}
    with open(log_path, "ab") as log:
        header = f"# sessiongen: {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n"
        log.write(header.encode())
        log.flush()
        return subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def proc_starttime(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    stat = _read_stat(pid)
    return int(stat[19]) if stat else None


def boot_id() -> str:
    """This boot's id: pids from another boot never name our processes."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    """Pids of the living (not zombie) processes in process group ``pgid``."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _read_stat(int(entry.name))
        # After the ")" closing the command name: state, ppid, pgrp, ...
        if stat and int(stat[2]) == pgid and stat[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def is_ours(record: ProcessRecord) -> bool:
    """False when the recorded leader pid now belongs to a different process.

    A leader that is gone is still "ours": Linux does not hand out a pid that is in use
    as a process group id, so remaining members of the group are our orphans.
    """
    now = proc_starttime(record.pid)
    return now is None or record.starttime is None or now == record.starttime


def group_alive(record: ProcessRecord) -> bool:
    """True when the group still has living members and is ours."""
    return is_ours(record) and bool(group_members(record.pgid))


def stop_groups(
    records: Sequence[ProcessRecord],
    grace_s: float,
    children: Mapping[int, subprocess.Popen[bytes]] | None = None,
) -> dict[str, str]:
    """Stop the process groups of ``records``: SIGTERM to all, SIGKILL after ``grace_s``.

    All groups are signalled at once so their shutdowns overlap. ``children`` (by pid)
    are the leaders this process started, which it must reap itself. A Ctrl-C while
    waiting skips the grace period, kills everything, and is re-raised. Returns a
    one-word outcome per record name: ``stopped``, ``killed``, ``gone`` (nothing was
    running), ``not ours`` (pid reused) or ``left`` (survived SIGKILL).
    """
    children = children or {}
    outcome: dict[str, str] = {}
    pending: list[ProcessRecord] = []
    for rec in records:
        _reap(children.get(rec.pid))
        if not is_ours(rec):
            outcome[rec.name] = "not ours"
        elif not group_members(rec.pgid):
            outcome[rec.name] = "gone"
        else:
            _signal_group(rec.pgid, signal.SIGTERM)
            pending.append(rec)
    try:
        pending = _wait_groups(pending, grace_s, children)
    except BaseException:
        for rec in pending:
            _signal_group(rec.pgid, signal.SIGKILL)
        raise
    for rec in records:
        if rec.name not in outcome and rec not in pending:
            outcome[rec.name] = "stopped"
    for rec in pending:
        _signal_group(rec.pgid, signal.SIGKILL)
    survivors = _wait_groups(pending, 10.0, children)
    for rec in pending:
        outcome[rec.name] = "left" if rec in survivors else "killed"
    return outcome


def log_tail(path: Path, lines: int = 15, max_bytes: int = 16384) -> str:
    """The last ``lines`` non-empty lines of a log, colour codes removed."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    kept = [line.rstrip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file in the same folder and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _wait_groups(
    records: Iterable[ProcessRecord],
    timeout_s: float,
    children: Mapping[int, subprocess.Popen[bytes]],
) -> list[ProcessRecord]:
    """Wait until the groups are empty or ``timeout_s`` passes; return those still alive."""
    pending = list(records)
    deadline = time.monotonic() + timeout_s
    while pending:
        for rec in pending:
            _reap(children.get(rec.pid))
        pending = [rec for rec in pending if group_members(rec.pgid)]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return pending


def _reap(child: subprocess.Popen[bytes] | None) -> None:
    if child is not None:
        child.poll()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _read_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (state is index 0)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name may contain spaces and parentheses; it ends at the last ")".
    return raw[raw.rfind(")") + 2 :].split()
