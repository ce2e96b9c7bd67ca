"""Calibration: the reference server's clock, recovering a planted client delay, figures.

Bounds are generous and comparisons relative: these run on a shared 2-core machine
where a neighbour can take the CPU for milliseconds at any time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest

from sessiongen import scenario
from sessiongen.calibrate import measure as calibrate
from sessiongen.client import driver


@pytest.fixture(scope="module")
def ref_url() -> Iterator[str]:
    with calibrate.ReferenceServer() as server:
        yield server.url


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert calibrate.percentile(values, 50) == 50
    assert calibrate.percentile(values, 99) == 99
    assert calibrate.percentile(values, 100) == 100
    assert calibrate.percentile([3.0], 99) == 3.0
    assert calibrate.percentile([1.0, 2.0], 50) == 1.0  # an observed value, not 1.5
    assert math.isnan(calibrate.percentile([], 50))


def test_scenario_load_uses_the_largest_turn_one_request_and_caps_concurrency() -> None:
    sc = scenario.from_dict(
        {
            "name": "load",
            "sessions": {"count": 100, "initial_context_tokens": [32768, 131072]},
            "driver": {"concurrency": 64},
        }
    )
    concurrency, body = calibrate.scenario_load(sc)
    assert concurrency == 64
    assert body == int((131072 + sc.sessions.question_tokens) * calibrate.BYTES_PER_TOKEN) + 300
    few = scenario.from_dict(
        {"name": "few", "sessions": {"count": 3}, "driver": {"concurrency": 64}}
    )
    assert calibrate.scenario_load(few)[0] == 3


def test_request_body_has_about_the_asked_size() -> None:
    assert len(calibrate.request_body(500_000)) == 500_000
    assert len(calibrate.request_body(1)) < 100


async def test_reference_server_stamps_one_clock_with_the_client(ref_url: str) -> None:
    headers = {calibrate.DELAY_HEADER: "0.05", calibrate.CHUNKS_HEADER: "5"}
    body = calibrate.request_body(300_000)  # larger than one write slice
    async with driver.Client(1, 10.0) as client:
        res = await client.send(ref_url + driver.CHAT_PATH, body, headers=headers)
    assert res.ok, res.error
    assert len(res.chunk_ns) == 5 and res.completion_tokens == 5
    stamps = res.usage_chunk or {}
    rx, tx, own = stamps["server_rx_ns"], stamps["server_tx_ns"], stamps["server_ns"]
    assert tx - rx == own
    assert own >= 0.049e9  # it waited its delay after the body arrived
    # Both processes read the same monotonic clock: events happen in causal order.
    assert res.send_ns < rx < tx < res.chunk_ns[0]
    assert res.ttft_s is not None and res.ttft_s * 1e9 >= own


async def test_calibration_recovers_an_injected_client_delay(ref_url: str) -> None:
    async def measure(injected_s: float) -> dict[str, Any]:
        return await calibrate.measure_steady(
            ref_url,
            concurrency=4,
            body_bytes=100_000,
            duration_s=1.0,
            chunks=4,
            injected_delay_s=injected_s,
        )

    base = await measure(0.0)
    slow = await measure(0.02)
    assert base["failed"] == 0 and slow["failed"] == 0
    assert base["requests"] >= 8 and slow["requests"] >= 8
    assert base["added_ttft_p50_ms"] < 10
    extra = slow["added_ttft_p50_ms"] - base["added_ttft_p50_ms"]
    assert 17 <= extra <= 30, (base, slow)
    # The planted delay is before the request is written: it shows up upstream.
    assert slow["upstream_p50_ms"] - base["upstream_p50_ms"] >= 17


async def test_burst_measures_every_request(ref_url: str) -> None:
    fig = await calibrate.measure_burst(ref_url, concurrency=8, body_bytes=50_000, rounds=2)
    assert fig["requests"] == 16 and fig["failed"] == 0
    assert 0 <= fig["added_ttft_p50_ms"] <= fig["added_ttft_max_ms"]
    # 16 requests are too few for an honest p90 (64) or p99 (662): none is given.
    assert fig["added_ttft_p90_ms"] is None and fig["added_ttft_p99_ms"] is None


async def test_stream_rate_counts_every_chunk_one_per_read(ref_url: str) -> None:
    fig = await calibrate.measure_stream_rate(ref_url, streams=4, chunks=200, interval_s=0.002)
    assert fig["chunks"] == 800
    assert fig["chunks_per_s"] > 0 and fig["chunks_per_cpu_s"] > 0
    assert fig["chunks_per_read"] < 5  # paced: reads are not batched (much)


def test_calibrate_returns_flat_figures_for_the_manifest() -> None:
    out = calibrate.calibrate(
        2, 20_000, duration_s=0.5, burst_rounds=1, rate_streams=2, rate_chunks=100
    )
    for key in (
        "added_ttft_p50_ms",
        "added_ttft_max_ms",
        "burst_added_ttft_max_ms",
        "lag_max_ms",
        "stream_chunks_per_cpu_s",
    ):
        assert isinstance(out[key], float) and math.isfinite(out[key]), key
    assert out["requests"] < 662 and out["added_ttft_p99_ms"] is None  # too few for a p99
    assert out["burst_requests"] == 2 and out["burst_added_ttft_p99_ms"] is None
    assert out["concurrency"] == 2 and out["failed"] == 0 and out["burst_failed"] == 0
    assert out["verdict"].startswith("the client adds ")
    assert not any(isinstance(v, dict) for v in out.values())  # one table row per key


def test_calibrate_refuses_a_running_loop() -> None:
    async def inside() -> None:
        with pytest.raises(RuntimeError):
            calibrate.calibrate(1, 1000, duration_s=0.1)

    asyncio.run(inside())
