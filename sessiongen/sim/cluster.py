"""All simulated replicas in modeled time: one event queue, no clock of its own.

A :class:`Cluster` holds every replica's :class:`~sessiongen.sim.scheduler.ReplicaScheduler`
and the shared :class:`~sessiongen.sim.pool.Pool`, and processes two kinds of event in
modeled-time order: a request's arrival at a replica, and a replica's step boundary
(the end of its current step, where the next one is formed). The drivers decide how
time passes:

- :mod:`sessiongen.sim.virtual` advances to the next event at once (a virtual clock);
- the served simulator (:mod:`sessiongen.sim.engine`) advances to "now" as the wall
  clock reaches each event, ``time_scale`` wall seconds per modeled second.

One queue for all replicas, not one task per replica: the replicas share the pool (its
contents and its link), so whether a lookup sees another replica's chunks, and whose
load goes first on the link, is decided in modeled-time order, the same way under both
clocks. Simultaneous events go arrivals first, so requests that arrive at the moment a
step ends join the next step.

An arrival at an idle replica wakes it at the arrival time, and so does the end of an
asynchronous pool load (``pool_load_mode = "async"``) at a replica with nothing else to
do; the served driver submits requests after parsing them, so that time may lie a
little in the past, which is how the simulator's own work is absorbed rather than
added. Listeners hear of each step when it is formed (who was admitted, preempted, who
samples a token at its end) and when it ends (who finished).
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.pool import Pool
from sessiongen.sim.scheduler import ReplicaScheduler, SimRequest, Step

_ARRIVAL, _BOUNDARY = 0, 1


class Listener(Protocol):
    """What a driver hears from the engine."""

    def step_started(self, replica: int, step: Step) -> None: ...

    def step_ended(self, replica: int, step: Step) -> None: ...


class Cluster:
    """Every replica's scheduler, the shared pool and the event queue."""

    def __init__(
        self,
        profile: SimProfile,
        *,
        shared_cache: bool,
        listener: Listener,
        collapse: bool = False,
    ) -> None:
        self.profile = profile
        self.pool = Pool(profile, shared_cache)
        self.replicas = [ReplicaScheduler(profile, i, self.pool) for i in range(profile.replicas)]
        self.listener = listener
        self.collapse = collapse
        n = profile.replicas
        self._steps: list[Step | None] = [None] * n
        self._idle_since = [-math.inf] * n
        self._wake_at: list[float | None] = [None] * n
        self._version = [0] * n
        self._heap: list[tuple[float, int, int, int, int, SimRequest | None]] = []
        self._seq = itertools.count()
        self.now = -math.inf  # time of the latest event processed
        self.events = 0
        self.finished = 0  # requests finished so far

    def submit(self, req: SimRequest, replica: int) -> None:
        """Queue ``req``'s arrival at ``replica`` (at ``req.arrival``)."""
        if not 0 <= replica < len(self.replicas):
            raise ValueError(f"replica {replica} outside 0..{len(self.replicas) - 1}")
        item = (req.arrival, _ARRIVAL, next(self._seq), replica, 0, req)
        heapq.heappush(self._heap, item)

    def abort(self, req: SimRequest, replica: int) -> None:
        """Drop a request wherever it is (a pending arrival is skipped when it comes)."""
        req.aborted = True
        self.replicas[replica].abort(req)

    def current_step(self, replica: int) -> Step | None:
        return self._steps[replica]

    def next_time(self) -> float | None:
        """The time of the next event, None when there is none."""
        heap = self._heap
        while heap:
            t, kind, _seq, r, version, _req = heap[0]
            if kind == _BOUNDARY and version != self._version[r]:
                heapq.heappop(heap)
                continue
            return t
        return None

    def advance(self, until: float, settle: bool = False) -> None:
        """Process every event at or before ``until``, in time order.

        ``settle``: once a request has finished, only the events at its time are
        processed after it. A driver whose finish callbacks may schedule arrivals from
        that time on can then advance to its own next event in one call instead of one
        engine time at a time, and gets the same order.
        """
        heap = self._heap
        finished = self.finished
        while heap and heap[0][0] <= until:
            t, kind, _seq, r, version, req = heapq.heappop(heap)
            if kind == _BOUNDARY:
                if version == self._version[r]:
                    self.now = max(self.now, t)
                    self._boundary(r, t)
            else:
                assert req is not None
                self.now = max(self.now, t)
                self._arrive(r, req, t)
            self.events += 1
            if settle and self.finished != finished and t < until:
                until = t

    def _arrive(self, r: int, req: SimRequest, t: float) -> None:
        if req.aborted:
            return
        sched = self.replicas[r]
        sched.add(req)
        step = self._steps[r]
        if step is None:
            wake = max(t, self._idle_since[r])
            pending = self._wake_at[r]
            if pending is None or wake < pending:
                self._wake_at[r] = wake
                self._push_boundary(r, wake)
        elif step.count > 1 and step.open and sched.truncate(step, t):
            self._push_boundary(r, step.end)

    def _boundary(self, r: int, t: float) -> None:
        sched = self.replicas[r]
        step = self._steps[r]
        if step is not None:
            sched.complete(step)
            self.finished += len(step.finished)
            self.listener.step_ended(r, step)
        self._wake_at[r] = None
        new = sched.schedule(t)
        self._steps[r] = new
        if new is None:
            self._idle_since[r] = t
            ready = sched.next_ready()
            if ready is not None:  # an asynchronous pool load wakes it when it ends
                self._wake_at[r] = max(ready, t)
                self._push_boundary(r, max(ready, t))
            return
        if self.collapse:
            sched.extend(new)
        self._push_boundary(r, new.end)
        self.listener.step_started(r, new)

    def _push_boundary(self, r: int, t: float) -> None:
        self._version[r] += 1
        heapq.heappush(self._heap, (t, _BOUNDARY, next(self._seq), r, self._version[r], None))
