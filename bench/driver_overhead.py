"""Benchmark: the driver's added TTFT and its streaming throughput.

    .venv/bin/python bench/driver_overhead.py [--concurrency 1 64 256] [--body-mb 0.5]

Against a reference server in its own process that answers after a known delay:
added TTFT (client TTFT minus the server's own time to first chunk) at p50, p99 and
max per concurrency level with 0.5 MB request bodies, the event loop's worst lag,
and content chunks parsed per second on one core.
"""

from __future__ import annotations

import argparse
import asyncio

from sessiongen.calibrate import ReferenceServer, measure_added_ttft, measure_stream_rate


async def run(args: argparse.Namespace, url: str) -> None:
    print(
        f"{'streams':>8} {'body':>9} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'max ms':>8} {'lag ms':>7}"
    )
    for c in args.concurrency:
        f = await measure_added_ttft(
            url, concurrency=c, body_bytes=int(args.body_mb * 2**20), rounds=args.rounds
        )
        print(
            f"{c:>8} {f.body_bytes / 2**20:>7.2f}MB {f.requests:>5} {f.added_p50_ms:>8.2f} "
            f"{f.added_p99_ms:>8.2f} {f.added_max_ms:>8.2f} {f.loop_lag_max_ms:>7.2f}"
        )
    rate = await measure_stream_rate(url, chunks=args.chunks)
    print(f"stream rate, one stream: {rate:,.0f} chunks/s")
    rate = await measure_stream_rate(url, chunks=args.chunks // 16, streams=16)
    print(f"stream rate, 16 streams: {rate:,.0f} chunks/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--body-mb", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=100_000)
    args = ap.parse_args()
    with ReferenceServer() as server:
        asyncio.run(run(args, server.url))


if __name__ == "__main__":
    main()
