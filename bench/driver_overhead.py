"""Benchmark: the driver's added TTFT and its streaming capacity. Prints, asserts nothing.

    .venv/bin/python bench/driver_overhead.py [--concurrency 1 64 256] [--body-mb 0.5]
        [--duration 5] [--rounds 3] [--nice N]
    .venv/bin/python bench/driver_overhead.py --in-flight 1000 [--hold-s 5] [--chunks 20]
        [--interval-s 0.25] [--body-mb 0.05] [--duration 20] [--no-write]

Against the reference server of :mod:`sessiongen.calibrate.refserver` (its own process; it stamps
the kernel's receive time of each request's last byte and its own write of the first
chunk, on the monotonic clock the client reads too):

- *steady*: N closed-loop streams started spread over one request cycle (server delay
  50 ms, then 20 chunks 10 ms apart): the load a replay puts on the driver, harsher
  (a replay's requests last seconds, not 250 ms);
- *burst*: N requests released at the same instant, all bodies through one loopback at
  once: mostly loopback bandwidth and queueing in two event loops, shown for contrast;
- *floor*: a blocking-socket client with no event loop, one request at a time: what any
  client pays on this machine for loopback and process wake-ups;
- stream capacity: content chunks per second of client CPU with the server writing one
  chunk per write, paced so that reads are not batched (chunks/read near 1), and flat
  out (reads batched: the figure flatters the client, shown for contrast).

``--in-flight N`` measures only the *in-flight* shape, a trace replay's: N closed-loop
streams whose requests each last ``hold + chunks x interval`` (default 5 s queued
before the first token, then 20 tokens 0.25 s apart: 1,000 streams are 100 requests
and 2,000 chunks a second, about 30 times a Mooncake replay's request rate at that
many in flight), bodies of a 12k-token prompt's size. Its row goes to
``docs/data/served-rate.json`` (section ``client``, with the commit, date, machine, load
and command) unless ``--no-write``; ``bench/served_rate.py`` writes the served pair's.

``added`` = client TTFT - server's own time; ``up`` = send -> last body byte in the
server's socket; ``down`` = server's write of the first chunk -> client timestamp.
``p99own``: p99 over the ``n_own`` requests that no stall spent waiting for a CPU (the
neighbours' doing, not the client's) reached into. ``stalls``: event-loop stalls over 1 ms; ``pre``:
those spent mostly waiting for a CPU.
On a shared machine run it more than once: neighbours move the tails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from sessiongen.calibrate import measure
from sessiongen.calibrate.refserver import CHUNKS_HEADER, DELAY_HEADER, ReferenceServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from served_rate import provenance, update_data  # a sibling bench script

COLUMNS = (  # (key, heading, width, decimals)
    ("requests", "n", 6, 0),
    ("added_ttft_p50_ms", "p50", 7, 2),
    ("added_ttft_p99_ms", "p99", 7, 2),
    ("added_ttft_p99_own_ms", "p99own", 7, 2),
    ("requests_own", "n_own", 6, 0),
    ("added_ttft_max_ms", "max", 7, 2),
    ("upstream_p50_ms", "up50", 6, 2),
    ("upstream_p99_ms", "up99", 6, 2),
    ("downstream_p50_ms", "dn50", 6, 2),
    ("downstream_p99_ms", "dn99", 6, 2),
    ("lag_max_ms", "lagmax", 7, 1),
    ("lag_stalls", "stalls", 6, 0),
    ("lag_preempted", "pre", 4, 0),
    ("failed", "fail", 4, 0),
)


def _row(label: str, streams: int, fig: dict[str, Any]) -> str:
    cells = [f"{label:<7}", f"{streams:>5}"]
    cells += [  # None: too few requests for the early-stopping tail
        f"{'-' if fig[key] is None else format(fig[key], f'.{places}f'):>{width}}"
        for key, _h, width, places in COLUMNS
    ]
    return " ".join(cells)


def _header() -> str:
    heads = [f"{'shape':<7}", f"{'N':>5}"] + [f"{h:>{w}}" for _k, h, w, _p in COLUMNS]
    return " ".join(heads) + "   (ms)"


def floor(url: str, body_bytes: int, requests: int = 30) -> dict[str, float]:
    """Added TTFT of a blocking-socket client: the machine's floor for any client."""
    parts = urlsplit(url)
    body = measure.request_body(body_bytes)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"{DELAY_HEADER}: 0.05\r\n{CHUNKS_HEADER}: 2\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    stamp = re.compile(rb'"server_ns":(\d+)')
    added: list[float] = []
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(requests + 1):
            buf = b""
            first = server_ns = 0
            start = time.perf_counter_ns()
            sock.sendall(head + body)
            while not buf.endswith(b"0\r\n\r\n"):
                buf += sock.recv(1 << 16)
                if not first and (found := stamp.search(buf)):
                    first, server_ns = time.perf_counter_ns(), int(found.group(1))
            if i:  # the first request warms the path
                added.append((first - start - server_ns) / 1e6)
    added.sort()
    return {
        "requests": len(added),
        "added_ttft_p50_ms": measure.percentile(added, 50),
        "added_ttft_p99_ms": measure.percentile(added, 99),
        "added_ttft_max_ms": added[-1],
    }


async def run(args: argparse.Namespace, url: str) -> None:
    body = int(args.body_mb * 2**20)
    print(_header())
    for n in args.concurrency:
        steady = await measure.measure_steady(
            url, concurrency=n, body_bytes=body, duration_s=args.duration
        )
        print(_row("steady", n, steady), flush=True)
        burst = await measure.measure_burst(url, concurrency=n, body_bytes=body, rounds=args.rounds)
        print(_row("burst", n, burst), flush=True)
    fl = floor(url, body)
    print(
        f"floor       1 {fl['requests']:>6} {fl['added_ttft_p50_ms']:>7.2f} "
        f"{fl['added_ttft_p99_ms']:>7.2f}         {fl['added_ttft_max_ms']:>7.2f}"
        "   (blocking socket, no event loop)"
    )
    print("\nstream capacity (server writes one chunk per write)")
    for label, streams, chunks, interval in (
        ("paced", 32, 1500, 0.001),
        ("paced", 64, 1500, 0.001),
        ("flat out", 8, 20_000, 0.0),
    ):
        r = await measure.measure_stream_rate(
            url, streams=streams, chunks=chunks, interval_s=interval
        )
        print(
            f"{label:<9} {streams:>3} streams: {r['chunks_per_cpu_s']:>9,.0f} chunks per "
            f"client CPU-second, {r['chunks_per_s']:>9,.0f} chunks/s wall, "
            f"{r['chunks_per_read']:.2f} chunks/read"
        )


async def in_flight(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """The in-flight shape (module doc): its figures, printed as a row."""
    fig = await measure.measure_steady(
        url,
        concurrency=args.in_flight,
        body_bytes=int(args.body_mb * 2**20),
        duration_s=args.duration,
        delay_s=args.hold_s,
        chunks=args.chunks,
        interval_s=args.interval_s,
    )
    print(_header())
    print(_row("flight", args.in_flight, fig), flush=True)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--body-mb", type=float, help="request body, MB (0.5; in-flight: 0.05)")
    ap.add_argument("--duration", type=float, default=5.0, help="steady-state seconds")
    ap.add_argument("--rounds", type=int, default=3, help="burst rounds")
    ap.add_argument(
        "--nice", type=int, default=0, help="niceness for client and server (root: < 0)"
    )
    ap.add_argument("--in-flight", type=int, default=0, help="only the in-flight shape, N streams")
    ap.add_argument("--hold-s", type=float, default=5.0, help="in-flight: server delay")
    ap.add_argument("--chunks", type=int, default=20, help="in-flight: chunks a response")
    ap.add_argument("--interval-s", type=float, default=0.25, help="in-flight: chunk spacing")
    ap.add_argument("--no-write", action="store_true", help="in-flight: print only")
    args = ap.parse_args()
    if args.body_mb is None:  # a 12k-token prompt is some 50 kB of JSON
        args.body_mb = 0.05 if args.in_flight else 0.5
    if args.nice:
        os.nice(args.nice)  # the server process inherits it
    print(
        f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, nice {args.nice}"
    )
    before = os.getloadavg()
    with ReferenceServer() as server:
        if args.in_flight:
            fig = asyncio.run(in_flight(args, server.url))
        else:
            asyncio.run(run(args, server.url))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.in_flight and not args.no_write:
        shape = {k: getattr(args, k) for k in ("hold_s", "chunks", "interval_s", "body_mb")}
        row = {
            **{k: fig[k] for k, *_ in COLUMNS},
            "in_flight": args.in_flight,
            "duration_s": args.duration,
            **shape,
            "load_before": [round(x, 2) for x in before],
            **provenance("python bench/driver_overhead.py " + " ".join(sys.argv[1:])),
        }
        update_data("client", {f"in_flight-{args.in_flight}": row})


if __name__ == "__main__":
    main()
