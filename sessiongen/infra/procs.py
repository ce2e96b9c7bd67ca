"""Process groups that sessiongen starts: start, liveness, stop without orphans.

Every server runs in its own session (so its own process group): vLLM forks an engine
core and workers, vllm-router re-executes itself, and one ``killpg`` reaches all of
them, while a Ctrl-C in the terminal reaches only sessiongen, which then stops the
groups in order: SIGTERM to all at once, SIGKILL to what is left after a grace period
(at once when a second signal asks to hurry, see :mod:`.signals`).

Linux only, like vLLM: liveness comes from ``/proc``, because a group whose leader died
can keep orphaned members, and zombies must not count as alive.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from sessiongen.infra import signals

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Group(Protocol):
    """What :func:`stop_groups` needs to know of a started process group."""

    @property
    def name(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def pgid(self) -> int: ...
    @property
    def starttime(self) -> int | None: ...


@dataclass(frozen=True)
class ChildGroup:
    """A process group led by a child of this process (the simplest :class:`Group`)."""

    name: str
    pid: int
    pgid: int
    starttime: int | None

    @classmethod
    def of(cls, name: str, child: subprocess.Popen[bytes]) -> ChildGroup:
        """The group of ``child``, started with ``start_new_session=True``."""
        return cls(name, child.pid, child.pid, proc_starttime(child.pid))


def spawn(
    argv: Sequence[str],
    env_overrides: Mapping[str, str],
    log_path: Path,
    *,
    stdin: int | IO[bytes] | None = subprocess.DEVNULL,
    stdout: int | IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session; stderr (and stdout unless given) to ``log_path``.

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
            stdin=stdin,
            stdout=log if stdout is None else stdout,
            stderr=log,
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


def is_ours(group: Group) -> bool:
    """False when the recorded leader pid now belongs to a different process.

    A leader that is gone is still "ours": Linux does not hand out a pid that is in use
    as a process group id, so remaining members of the group are our orphans.
    """
    now = proc_starttime(group.pid)
    return now is None or group.starttime is None or now == group.starttime


def group_alive(group: Group) -> bool:
    """True when the group still has living members and is ours."""
    return is_ours(group) and bool(group_members(group.pgid))


def stop_groups(
    groups: Sequence[Group],
    grace_s: float,
    children: Mapping[int, subprocess.Popen[bytes]] | None = None,
) -> dict[str, str]:
    """Stop ``groups``: SIGTERM to all, SIGKILL after ``grace_s``; no orphans left.

    All groups are signalled at once so their shutdowns overlap. ``children`` (by pid)
    are the leaders this process started, which it must reap itself. A second signal
    (:func:`.signals.hurried`) ends the grace period; a Ctrl-C that reaches the wait
    (no :func:`.signals.handling`) kills everything and is re-raised. Returns a
    one-word outcome per group name: ``stopped``, ``killed``, ``gone`` (nothing was
    running), ``not ours`` (pid reused) or ``left`` (survived SIGKILL).
    """
    children = children or {}
    outcome: dict[str, str] = {}
    pending: list[Group] = []
    for group in groups:
        _reap(children.get(group.pid))
        if not is_ours(group):
            outcome[group.name] = "not ours"
        elif not group_members(group.pgid):
            outcome[group.name] = "gone"
        else:
            signal_group(group.pgid, signal.SIGTERM)
            pending.append(group)
    try:
        pending = _wait_groups(pending, grace_s, children, hurry=True)
    except BaseException:
        for group in pending:
            signal_group(group.pgid, signal.SIGKILL)
        raise
    for group in groups:
        if group.name not in outcome and group not in pending:
            outcome[group.name] = "stopped"
    for group in pending:
        signal_group(group.pgid, signal.SIGKILL)
    survivors = _wait_groups(pending, 10.0, children)
    for group in pending:
        outcome[group.name] = "left" if group in survivors else "killed"
    for child in children.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(0.1 if child.poll() is None else 0)
    return outcome


def stop_child(name: str, child: subprocess.Popen[bytes], grace_s: float) -> str:
    """Stop the process group led by ``child`` (see :func:`stop_groups`); its outcome."""
    group = ChildGroup(name, child.pid, child.pid, None)
    return stop_groups([group], grace_s, {child.pid: child})[name]


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


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group; nothing if it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_groups(
    groups: Iterable[Group],
    timeout_s: float,
    children: Mapping[int, subprocess.Popen[bytes]],
    *,
    hurry: bool = False,
) -> list[Group]:
    """Wait until the groups are empty or ``timeout_s`` passes (or, with ``hurry``, a
    second signal asks to hurry); return those still alive."""
    pending = list(groups)
    deadline = time.monotonic() + timeout_s
    while pending:
        for group in pending:
            _reap(children.get(group.pid))
        pending = [group for group in pending if group_members(group.pgid)]
        if not pending or time.monotonic() >= deadline or (hurry and signals.hurried()):
            break
        time.sleep(0.05)
    return pending


def _reap(child: subprocess.Popen[bytes] | None) -> None:
    if child is not None:
        child.poll()


def _read_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (state is index 0)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name may contain spaces and parentheses; it ends at the last ")".
    return raw[raw.rfind(")") + 2 :].split()
