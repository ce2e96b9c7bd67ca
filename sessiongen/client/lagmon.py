"""Event-loop lag monitor: how late the driver's loop wakes up.

A task sleeps ``interval_s`` over and over; the overshoot of each wake-up beyond the
interval is the loop's lag: time during which no socket read could be timestamped.
Every timestamp a stalled loop takes is pushed to the stall's end, so a request is
affected exactly when its span (send to last timestamp) reaches into a stall: lags
above ``threshold_s`` (:data:`STALL_S`, 1 ms, as replay and calibrate use it) are kept
as the window ``[end - lag, end]`` ending at the late wake-up. A request is
**lag-flagged** (``loop_lag_flag``, :meth:`LagMonitor.lag_flag`) when the stalls inside
its wait for the first token add up to more than :data:`LAG_SHARE` (2%) of that TTFT:
relative, so it means the same at every time scale (5 ms of lag is noise beside a 3 s
cold prefill and a fifth of a 25 ms simulated local hit). That is the one definition;
the report and ``calibrate`` count the same thing. A warning may be logged (at most one
every ``warn_every_s`` seconds, with a count, so a struggling loop is not made worse by
logging).

A lag is also classed as *preempted* when, for at least half of it, the loop's thread
was runnable but waiting for a CPU (``run_delay`` of ``/proc/thread-self/schedstat``,
Linux): the machine was busy with other processes (neighbours on a shared host), not
this loop with its own work or a blocking call. The flag applies either way: a late
timestamp is late whatever the cause.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import time

log = logging.getLogger(__name__)

#: Stalls longer than this are kept (wall seconds): replay's and calibrate's threshold.
STALL_S = 0.001
#: A request is lag-flagged when stalls inside its wait for the first token exceed this
#: share of that TTFT.
LAG_SHARE = 0.02


class LagMonitor:
    """Samples event-loop lag while :meth:`run` is running as a task."""

    def __init__(
        self,
        interval_s: float = 0.005,
        threshold_s: float = 0.005,
        *,
        warn: bool = True,
        warn_every_s: float = 10.0,
    ) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.threshold_ns = int(threshold_s * 1e9)
        self.samples = 0
        self.max_ns = 0
        self.total_ns = 0
        self.events: list[tuple[int, int]] = []  # (start_ns, end_ns) of lags over threshold
        self.waited: list[bool] = []  # per event: spent mostly waiting for a CPU
        self._ends: list[int] = []  # end_ns of each event, for bisection
        self._warn = warn
        self._warn_every_ns = int(warn_every_s * 1e9)
        self._warned_at: int | None = None
        self._unwarned = 0
        self.preempted = 0

    async def run(self) -> None:
        """Sample until cancelled."""
        interval_s = self.interval_ns / 1e9
        waits = _RunDelay()
        try:
            while True:
                start, waited = time.perf_counter_ns(), waits.read()
                await asyncio.sleep(interval_s)
                end = time.perf_counter_ns()
                self.record(start, end, waited_ns=waits.read() - waited)
        finally:
            waits.close()

    def record(self, start_ns: int, end_ns: int, *, waited_ns: int = 0) -> None:
        """Account for one sample: a sleep of one interval from ``start_ns`` to ``end_ns``.

        ``waited_ns``: how long the thread waited for a CPU meanwhile (0 if unknown).
        """
        lag = max(0, end_ns - start_ns - self.interval_ns)
        self.samples += 1
        self.total_ns += lag
        self.max_ns = max(self.max_ns, lag)
        if lag > self.threshold_ns:
            preempted = 2 * waited_ns >= lag
            self.preempted += preempted
            self.waited.append(preempted)
            self.events.append((end_ns - lag, end_ns))
            self._ends.append(end_ns)
            self._unwarned += 1
            if self._warn and (
                self._warned_at is None or end_ns - self._warned_at >= self._warn_every_ns
            ):
                log.warning(
                    "event loop lagged %.1f ms (%d lag(s) over %.0f ms since the last "
                    "warning): requests in flight are flagged loop_lag_flag",
                    lag / 1e6,
                    self._unwarned,
                    self.threshold_ns / 1e6,
                )
                self._warned_at = end_ns
                self._unwarned = 0

    def flagged(self, start_ns: int, end_ns: int, *, preempted_only: bool = False) -> bool:
        """Whether a lag over the threshold overlapped [start_ns, end_ns].

        Windows are disjoint and in time order, so the first one ending after
        ``start_ns`` is found by bisection, not a scan of the whole run. With
        ``preempted_only``, only lags spent mostly waiting for a CPU count.
        """
        i = bisect.bisect_right(self._ends, start_ns)
        while i < len(self.events) and self.events[i][0] < end_ns:
            if not preempted_only or self.waited[i]:
                return True
            i += 1
        return False

    def overlap_ns(self, start_ns: int, end_ns: int) -> int:
        """Nanoseconds of lag over the threshold that fall inside [start_ns, end_ns].

        A timestamp taken during a stall is pushed to its end, so a request's measured
        times can be off by at most the lag its span overlaps: comparing this with the
        request's own TTFT says whether the lag mattered to it.
        """
        total = 0
        i = bisect.bisect_right(self._ends, start_ns)
        while i < len(self.events) and self.events[i][0] < end_ns:
            lo, hi = self.events[i]
            total += min(hi, end_ns) - max(lo, start_ns)
            i += 1
        return total

    def lag_flag(self, send_ns: int, first_ns: int) -> bool:
        """Whether stalls in ``[send_ns, first_ns]`` exceed :data:`LAG_SHARE` of that TTFT."""
        overlap = self.overlap_ns(send_ns, first_ns)
        return bool(overlap) and overlap > LAG_SHARE * max(1, first_ns - send_ns)

    def summary(self) -> dict[str, float]:
        """Figures for the manifest (milliseconds)."""
        return {
            "interval_ms": self.interval_ns / 1e6,
            "threshold_ms": self.threshold_ns / 1e6,
            "samples": self.samples,
            "max_ms": self.max_ns / 1e6,
            "mean_ms": (self.total_ns / self.samples / 1e6) if self.samples else 0.0,
            "over_threshold": len(self.events),
            "over_threshold_ms": sum(e - s for s, e in self.events) / 1e6,
            "over_threshold_preempted": self.preempted,
        }


class _RunDelay:
    """This thread's total time spent runnable but waiting for a CPU (Linux schedstat)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> int:
        """Nanoseconds waited so far (0 where the kernel does not tell)."""
        if self._fd is None:
            return 0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
