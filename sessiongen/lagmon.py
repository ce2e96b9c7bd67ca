"""Event-loop lag monitor: how late the driver's loop wakes up.

A task sleeps ``interval_s`` over and over; the overshoot of each wake-up beyond the
interval is the loop's lag: time during which no socket read could be timestamped.
Lags above ``threshold_s`` (5 ms by default) are kept, so requests in flight during
one can be flagged (``loop_lag_flag``) and the run summary can warn.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


class LagMonitor:
    """Samples event-loop lag while :meth:`run` is running as a task."""

    def __init__(self, interval_s: float = 0.005, threshold_s: float = 0.005) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.threshold_ns = int(threshold_s * 1e9)
        self.samples = 0
        self.max_ns = 0
        self.total_ns = 0
        self.events: list[tuple[int, int]] = []  # (start_ns, end_ns) of lags over threshold

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            start = time.perf_counter_ns()
            await asyncio.sleep(self.interval_ns / 1e9)
            end = time.perf_counter_ns()
            lag = max(0, end - start - self.interval_ns)
            self.samples += 1
            self.total_ns += lag
            self.max_ns = max(self.max_ns, lag)
            if lag > self.threshold_ns:
                self.events.append((end - lag, end))

    def flagged(self, start_ns: int, end_ns: int) -> bool:
        """Whether a lag over the threshold overlapped [start_ns, end_ns]."""
        return any(s < end_ns and e > start_ns for s, e in self.events)

    def summary(self) -> dict[str, Any]:
        """Figures for the manifest (milliseconds)."""
        return {
            "interval_ms": self.interval_ns / 1e6,
            "threshold_ms": self.threshold_ns / 1e6,
            "samples": self.samples,
            "max_ms": self.max_ns / 1e6,
            "mean_ms": (self.total_ns / self.samples / 1e6) if self.samples else 0.0,
            "over_threshold": len(self.events),
        }
