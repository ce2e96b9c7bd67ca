"""Tasks for sweep tests, in a module of their own: a spawned worker imports the module
of the function it runs, and this one costs nothing to import."""

from __future__ import annotations

import time

from sessiongen.errors import ScenarioError


def square_first_last(x: int) -> int:
    """Item 0 finishes last: results must still come back in the items' order."""
    if x == 0:
        time.sleep(1.0)
    return x * x


def refuse(x: int) -> int:
    """A user error, as a worker's scenario check raises one."""
    raise ScenarioError("grid.toml", "sessions.count", f"expected >= 1, got {x}")
