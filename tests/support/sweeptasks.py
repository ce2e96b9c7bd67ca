"""Tasks for sweep tests, in a module of their own: a spawned worker imports the module
of the function it runs, and this one costs nothing to import."""

from __future__ import annotations

import time
from pathlib import Path

from sessiongen.errors import ScenarioError


def square_first_last(x: int) -> int:
    """Item 0 finishes last: results must still come back in the items' order."""
    if x == 0:
        time.sleep(1.0)
    return x * x


def refuse(x: int) -> int:
    """A user error, as a worker's scenario check raises one."""
    raise ScenarioError("grid.toml", "sessions.count", f"expected >= 1, got {x}")


def long_or_failing(item: tuple[str, str]) -> str:
    """``("long", folder)`` marks its start, runs 30 s, marks its end; ``("fail",
    folder)`` waits for the long one to start, then raises a user error."""
    kind, folder = item
    started, ended = Path(folder) / "started", Path(folder) / "ended"
    if kind == "long":
        started.touch()
        time.sleep(30.0)
        ended.touch()
        return kind
    for _ in range(1200):  # the long task's start, at most a minute away
        if started.exists():
            break
        time.sleep(0.05)
    raise ScenarioError("grid.toml", "sessions.count", "expected >= 1, got 0")
