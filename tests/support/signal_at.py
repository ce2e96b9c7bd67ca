"""``python -m tests.support.signal_at POINT ARGS...``: sessiongen's command line (as
``python -m sessiongen ARGS...``) that sends itself SIGTERM on entering one named point of
its start-up (:data:`POINTS`), so a test signals each point every time, at no random delay.

The signal is sent from inside source text run with ``exec``, as a dataclass's generated
methods run while a module imports: its handler's ``KeyboardInterrupt`` is raised there,
the start-up window where CPython run as ``python -m`` used to end the process by SIGINT
whatever status it exited with.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

#: Start-up points in the order a replay passes them: (module, attribute to wrap). The
#: first comes before the CLI's handlers exist (the default SIGTERM ends the process).
POINTS: dict[str, tuple[str, str]] = {
    "before-handlers": ("sessiongen.infra.signals", "install"),
    "options-parsed": ("sessiongen.cli.replay", "load_scenario"),
    "target-made": ("sessiongen.replay.orchestrator", "make_target"),
    "run-starts": ("sessiongen.infra.signals", "run"),
    "simulator-starting": ("sessiongen.sim.process", "SimHandle.wait_ready"),
}

SEND = "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\ntotal = sum(range(1000))\n"


def _signalling(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        exec(SEND, {})  # the window under test: code run by exec
        return fn(*args, **kwargs)

    return wrapper


def arm(point: str) -> None:
    """Wrap ``point``'s function so that entering it sends SIGTERM (once)."""
    module_name, attr = POINTS[point]
    owner: Any = importlib.import_module(module_name)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, _signalling(getattr(owner, name)))


if __name__ == "__main__":
    arm(sys.argv[1])
    from sessiongen.cli import main

    main(sys.argv[2:])
