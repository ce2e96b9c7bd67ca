"""The event-loop lag monitor: a planted blocking call is caught and the requests in
flight during it are flagged; requests clear of every stall are not.

The live tests tolerate a busy machine: a neighbour can stall the loop too, so "not
flagged" is checked against the stalls the monitor actually saw.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import pytest

from sessiongen.client import driver
from sessiongen.client.lagmon import LagMonitor
from sessiongen.replay.runner import lag_matters
from tests.support.fakeserver import make_app

MS = 1_000_000

BODY = driver.serialize({"model": "sim-27b", "messages": [{"role": "user", "content": "hi"}]})


def test_flagged_means_overlapping_a_stall() -> None:
    mon = LagMonitor(interval_s=0.005, threshold_s=0.005, warn=False)
    mon.record(0, 5 * MS)  # on time
    mon.record(5 * MS, 30 * MS)  # 20 ms late: a stall over [10, 30] ms
    mon.record(30 * MS, 36 * MS)  # 1 ms late: under the threshold
    assert mon.events == [(10 * MS, 30 * MS)]
    assert mon.max_ns == 20 * MS and mon.samples == 3
    assert mon.flagged(0, 12 * MS)  # in flight when the stall began
    assert mon.flagged(25 * MS, 40 * MS)  # its timestamps were held up to 30 ms
    assert mon.flagged(0, 100 * MS)
    assert not mon.flagged(0, 9 * MS)  # done before the stall
    assert not mon.flagged(31 * MS, 100 * MS)  # sent after it


def test_flagged_by_bisection_agrees_with_a_scan() -> None:
    rng = random.Random(7)
    mon = LagMonitor(interval_s=0.005, threshold_s=0.005, warn=False)
    t = 0
    for _ in range(500):
        late = rng.choice([0, 1, 3, 8, 20]) * MS
        mon.record(t, t + 5 * MS + late)
        t += 5 * MS + late
    assert mon.events
    for _ in range(2000):
        a = rng.randrange(0, t)
        b = a + rng.randrange(0, 30 * MS)
        scan = any(s < b and e > a for s, e in mon.events)
        assert mon.flagged(a, b) == scan


def test_lags_over_the_threshold_are_warned_about_but_not_every_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mon = LagMonitor(warn_every_s=10.0)
    with caplog.at_level(logging.WARNING, logger="sessiongen.client.lagmon"):
        mon.record(0, 25 * MS)
        mon.record(25 * MS, 50 * MS)  # within 10 s of the first warning: counted, not logged
        mon.record(20_000 * MS, 20_020 * MS)
    warnings = [r for r in caplog.records if "event loop lagged" in r.getMessage()]
    assert len(warnings) == 2
    assert "2 lag(s)" in warnings[1].getMessage()
    summary = mon.summary()
    assert summary["over_threshold"] == 3 and summary["max_ms"] == pytest.approx(20.0)


async def test_a_planted_blocking_call_is_caught_and_its_request_flagged(
    aiohttp_server: Any,
) -> None:
    server = await aiohttp_server(make_app("ok", delay_s=0.15, chunks=2))
    url = str(server.make_url("/v1/chat/completions"))
    mon = LagMonitor(warn=False)
    task = asyncio.create_task(mon.run())
    async with driver.Client(2, 5.0) as client:
        await client.prewarm(url, 2)
        await asyncio.sleep(0.03)  # let the monitor take a few samples
        clear = await client.send(url, BODY)  # before the planted call
        clear_end = time.perf_counter_ns()
        in_flight = asyncio.create_task(client.send(url, BODY))
        await asyncio.sleep(0.05)  # the request is waiting for its first token
        blocked_at = time.perf_counter_ns()
        time.sleep(0.03)  # the planted blocking call
        res = await in_flight
        res_end = time.perf_counter_ns()
        await asyncio.sleep(0.02)  # one more sample after it
    task.cancel()
    assert clear.ok and res.ok
    assert mon.max_ns >= 20 * MS
    planted = [(s, e) for s, e in mon.events if e >= blocked_at + 25 * MS]
    assert planted, mon.events
    assert mon.flagged(res.send_ns, res_end)
    noise = [(s, e) for s, e in mon.events if s < clear_end and e > clear.send_ns]
    assert mon.flagged(clear.send_ns, clear_end) == bool(noise)  # only a neighbour's stall


def test_stalls_spent_waiting_for_a_cpu_are_told_apart() -> None:
    mon = LagMonitor(interval_s=0.005, threshold_s=0.005, warn=False)
    mon.record(0, 25 * MS, waited_ns=2 * MS)  # the loop's own 20 ms (busy or blocked)
    mon.record(25 * MS, 50 * MS, waited_ns=18 * MS)  # 20 ms mostly waiting for a CPU
    assert mon.preempted == 1 and mon.summary()["over_threshold_preempted"] == 1
    assert mon.flagged(0, 10 * MS) and not mon.flagged(0, 10 * MS, preempted_only=True)
    assert mon.flagged(0, 40 * MS, preempted_only=True)  # reaches the second stall
    assert mon.flagged(35 * MS, 40 * MS, preempted_only=True)


def test_overlap_counts_only_the_lag_inside_a_span() -> None:
    mon = LagMonitor(interval_s=0.005, threshold_s=0.001, warn=False)
    mon.record(0, 25 * MS)  # a 20 ms stall: [5, 25] ms
    mon.record(40 * MS, 48 * MS)  # a 3 ms stall: [45, 48] ms
    assert mon.overlap_ns(0, 100 * MS) == 23 * MS
    assert mon.overlap_ns(10 * MS, 46 * MS) == 15 * MS + 1 * MS
    assert mon.overlap_ns(26 * MS, 44 * MS) == 0


def test_a_request_is_flagged_only_when_the_lag_matters_to_its_ttft() -> None:
    mon = LagMonitor(interval_s=0.005, threshold_s=0.001, warn=False)
    mon.record(0, 10 * MS)  # a 5 ms stall: [5, 10] ms
    slow = driver.Result(send_ns=0, chunk_ns=[3000 * MS])  # a 3 s cold prefill
    fast = driver.Result(send_ns=0, chunk_ns=[40 * MS])  # a 40 ms simulated local hit
    assert not lag_matters(mon, slow)  # 5 ms of 3 s
    assert lag_matters(mon, fast)  # 5 ms of 40 ms
    after = driver.Result(send_ns=11 * MS, chunk_ns=[40 * MS])
    assert not lag_matters(mon, after)
