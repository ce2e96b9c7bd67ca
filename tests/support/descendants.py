"""Every process a test's subject started, found from ``/proc`` whatever became of it.

A test sets :data:`TAG_VAR` to a fresh value in the environment of what it runs; every
process started from there inherits it (the simulator, vLLM, routers and replay workers
all get a copy of sessiongen's environment), and keeps it after its parent died and it
was handed to init, after it left its parent's process group and session. So a tag
finds exactly the processes the test caused, none of the other agents' on this machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

TAG_VAR = "SESSIONGEN_TEST_TAG"


def new_tag() -> str:
    """A value for :data:`TAG_VAR` that no other test uses."""
    return uuid.uuid4().hex


def tagged(tag: str) -> list[int]:
    """Pids of the living (not zombie) processes whose environment carries ``tag``."""
    wanted = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        state = stat[stat.rfind(")") + 2 :].split()[0]
        if wanted in environ.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def describe(pids: list[int]) -> str:
    """Command lines and states of ``pids``, for a failure message."""
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        lines.append(f"pid {pid} state {fields[0]} ppid {fields[1]}: {cmd[:160]}")
    return "\n".join(lines)


def survivors(tag: str, deadline_s: float) -> list[int]:
    """Wait until no process carries ``tag`` or ``deadline_s`` passes; those left.

    Polled, not slept: it returns as soon as they are gone, and the deadline is there
    for a slow, busy machine, not as a measure of speed.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        left = tagged(tag)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def kill(pids: list[int]) -> None:
    """SIGKILL what a failed test left, so it does not outlive the test."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
