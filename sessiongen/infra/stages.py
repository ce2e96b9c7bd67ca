"""Where a command's time goes: wall and CPU seconds per named stage (``plan --verbose``).

One module-level :data:`TIMER` that the stages of a command enter by name
(``with stage("report"):``); a stage entered again adds to its total, and a stage inside
another counts in both (the outer one is the sum). It times only when a command turned it
on (:meth:`StageTimer.start`), so the stages cost nothing otherwise; a worker process of a
sweep has its own, switched off, timer. Wall time is ``time.perf_counter``, CPU time
``time.process_time`` (this process only: not its workers).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StageTime:
    """One stage's totals: wall and CPU seconds and how many times it was entered."""

    name: str
    wall_s: float
    cpu_s: float
    count: int


class StageTimer:
    """Per-stage totals in the order the stages were first entered (module doc)."""

    def __init__(self) -> None:
        self.enabled = False
        self._totals: dict[str, list[float]] = {}

    def start(self, *, since_process_start: str | None = None) -> None:
        """Time from now on, forgetting any earlier totals; ``since_process_start``
        names a first stage: the process's life so far (its start-up and imports)."""
        self.enabled = True
        self._totals.clear()
        if since_process_start is not None:
            age = process_age_s()
            cpu = time.process_time()
            self.add(since_process_start, wall_s=cpu if age is None else age, cpu_s=cpu)

    def add(self, name: str, *, wall_s: float, cpu_s: float) -> None:
        """Add a stage's time measured elsewhere (a block's, from its progress)."""
        if not self.enabled:
            return
        total = self._totals.setdefault(name, [0.0, 0.0, 0.0])
        total[0] += wall_s
        total[1] += cpu_s
        total[2] += 1

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the ``with`` body as stage ``name``."""
        if not self.enabled:
            yield
            return
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.add(name, wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)

    def times(self) -> list[StageTime]:
        return [StageTime(k, w, c, int(n)) for k, (w, c, n) in self._totals.items()]

    def lines(self) -> list[str]:
        """One line a stage: ``stage NAME: W s wall, C s CPU`` (and the count when > 1)."""
        return [
            f"stage {t.name}: {t.wall_s:.3f} s wall, {t.cpu_s:.3f} s CPU"
            + (f" ({t.count}x)" if t.count > 1 else "")
            for t in self.times()
        ]


def process_age_s() -> float | None:
    """Wall seconds since this process started (Linux's ``/proc``; None elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # field 22 of stat (20th after the command's name): start time in clock ticks since boot
    return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)


#: The process's timer (module doc).
TIMER = StageTimer()


def stage(name: str) -> AbstractContextManager[None]:
    """``TIMER.stage(name)``: time the ``with`` body as stage ``name`` when timing is on."""
    return TIMER.stage(name)
