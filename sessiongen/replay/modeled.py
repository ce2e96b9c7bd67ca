"""Modeled arrivals: a replay on the simulated pair that says when each request arrives.

A served simulator maps modeled seconds to wall seconds; a request that arrives when
its handler runs lets every delay of a busy machine (the client's loop, its sleeps,
the connection, the parser) into the modeled clock, magnified by ``1 / time_scale``,
and decides the engine's order of nearly simultaneous arrivals, which decides whose
prefix stays cached. Two replays of one scenario then differ.

So where every replica of the block runs on one simulated engine (``GET /sim/config``
names the same ``clock`` on each), the closed loop is run on the engine's modeled
clock, as the planner runs it: a session's first turn arrives when it is ready
(the block's start, sessions :data:`~sessiongen.design.arrivals.START_STAGGER_S`
apart, or its open-loop offset) or when a concurrency slot frees (the modeled end
of the session that held it), and each later turn at the previous turn's modeled end
(the response's ``modeled_end_s``) plus the think time. Each request states that time
(``X-Sim-Arrival-S``) and is sent :data:`AHEAD_S` wall seconds before it; the
simulator holds it until then and says how long (``due_after_entry_s``; negative for a
request that came in after its time, which the engine still takes at that time when it
is not past it). Wall durations lose that offset, so they keep meaning what they mean.
Each request also states its identity (``X-Sim-Request-Key``), which draws its
service-time noise (:mod:`sessiongen.sim.noise`) whatever the order of arrivals.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import aiohttp

from sessiongen.client.driver import Result
from sessiongen.sim.wire import ARRIVAL_HEADER, REQUEST_KEY_HEADER

#: Wall seconds a request is sent before its stated arrival: room for the client's
#: and the simulator's own delays on a busy machine.
AHEAD_S = 0.25


@dataclass(frozen=True)
class ModeledClock:
    """The simulated engine's clock as the client maps it to ``perf_counter_ns``."""

    now_s: float  # the engine's modeled time when it was read
    read_ns: int  # perf_counter_ns when it was read
    time_scale: float  # wall seconds per modeled second

    @property
    def start_s(self) -> float:
        """Modeled time the block's sessions may start: far enough ahead to send early."""
        return self.now_s + AHEAD_S / self.time_scale

    def wall_ns(self, modeled_s: float) -> int:
        """``perf_counter_ns`` at modeled time ``modeled_s``."""
        return self.read_ns + int((modeled_s - self.now_s) * self.time_scale * 1e9)

    def modeled_at(self, wall_ns: int) -> float:
        return self.now_s + (wall_ns - self.read_ns) / 1e9 / self.time_scale

    async def sleep_to_send(self, modeled_s: float) -> None:
        """Until :data:`AHEAD_S` before the wall time of ``modeled_s``."""
        delay = (self.wall_ns(modeled_s) - time.perf_counter_ns()) / 1e9 - AHEAD_S
        if delay > 0:
            await asyncio.sleep(delay)


def header(modeled_s: float, key: str) -> dict[str, str]:
    """The request headers that state its modeled arrival and its noise key
    (:func:`sessiongen.experiment.script.turn_key`)."""
    return {ARRIVAL_HEADER: repr(modeled_s), REQUEST_KEY_HEADER: key}


async def read_clock(
    http: aiohttp.ClientSession, urls: tuple[str, ...], time_scale: float
) -> ModeledClock | None:
    """The block's one modeled clock, or None when its replicas do not share one (or
    are not the simulator, or cannot say)."""
    if not urls:
        return None
    facts = []
    for url in urls:
        try:
            async with http.get(url + "/sim/config") as resp:
                if resp.status != 200:
                    return None
                facts.append(await resp.json())
        except (aiohttp.ClientError, ValueError):
            return None
    read_ns = time.perf_counter_ns()
    clocks = {f.get("clock") for f in facts if isinstance(f, dict)}
    now = facts[-1].get("modeled_now_s") if isinstance(facts[-1], dict) else None
    if len(clocks) != 1 or None in clocks or not isinstance(now, int | float):
        return None
    if not math.isfinite(now) or time_scale <= 0:
        return None
    return ModeledClock(now_s=float(now), read_ns=read_ns, time_scale=time_scale)


def modeled_end(res: Result) -> float | None:
    """The modeled end of a response, where the simulator gives it."""
    end = res.server_facts("sim").get("modeled_end_s")
    return float(end) if isinstance(end, int | float) else None


def measure_from(res: Result) -> None:
    """Make ``res``'s durations count from its stated arrival, not from the send.

    The simulator says how far its handler's entry lay before the stated arrival's wall
    time (``due_after_entry_s``, on its own clock): positive when it held an early
    request, negative when the request came in after its time and the engine, not yet
    past it, took it at that time. The durations lose exactly that, so they keep the
    request's way to the simulator, as a request sent on time would. Mapping the stated
    arrival through :class:`ModeledClock` instead would put the clock reading's own
    latency (milliseconds, 10% of a fast turn) into every duration."""
    offset = res.server_facts("sim").get("due_after_entry_s")
    if not isinstance(offset, int | float) or offset == 0 or res.send_ns == 0:
        return
    shift = float(offset)
    res.send_ns += int(shift * 1e9)
    if res.ttfb_s is not None:
        res.ttfb_s = max(0.0, res.ttfb_s - shift)
    if res.ttft_s is not None:
        res.ttft_s = max(0.0, res.ttft_s - shift)
    if res.e2e_s is not None:
        res.e2e_s = max(0.0, res.e2e_s - shift)
