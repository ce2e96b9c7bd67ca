"""Benchmark: client memory with 1,000 concurrent 128k-token sessions in flight. Prints only.

    .venv/bin/python bench/client_memory.py [--sessions 1000] [--context 131072]
        [--turns 2] [--hold 2.0]

Replays the way ``replay`` does, against the reference server of
:mod:`sessiongen.calibrate.measure` (its own process, so its memory is not counted): builds
every session's texts first (``SessionBuilder``, as a block does before any request is
timed), then runs all sessions at once, each turn building its request, serializing
the body and keeping both alive while the response streams (the server holds every
stream open ``--hold`` seconds so that all bodies are in flight together).

Prints the client's resident memory (RSS) at each stage, its peak (``ru_maxrss``),
and what the texts and bodies account for, against the 2 GiB target.

Bodies go out as replay sends them: in parts around each session's context, which is
kept once as escaped JSON bytes (``sessions.Blob``), so a request in flight holds only
its own small parts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import time
from collections.abc import Sequence

from sessiongen import calibrate, scenario
from sessiongen.calibrate import refserver
from sessiongen.client import driver
from sessiongen.workload.sessions import Session, SessionBuilder

GIB = 2**30
MIB = 2**20


def rss() -> int:
    """Resident set size now, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """Peak resident set size so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


class Tally:
    """Bodies and request texts in flight, and the RSS peak seen by a sampler."""

    def __init__(self) -> None:
        self.bodies = self.texts = self.max_bodies = self.max_texts = 0
        self.in_flight = self.max_in_flight = 0
        self.max_rss = 0

    def add(self, body: int, text: int, sign: int) -> None:
        self.bodies += sign * body
        self.texts += sign * text
        self.in_flight += sign
        if self.in_flight > self.max_in_flight or self.bodies > self.max_bodies:
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.max_bodies, self.max_texts = self.bodies, self.texts

    async def sample(self) -> None:
        while True:
            self.max_rss = max(self.max_rss, rss())
            await asyncio.sleep(0.02)


async def run_session(
    client: driver.Client,
    url: str,
    sc: scenario.Scenario,
    s: Session,
    tally: Tally,
    hold_s: float,
) -> str | None:
    headers = {refserver.DELAY_HEADER: str(hold_s), refserver.CHUNKS_HEADER: "8"}
    context = s.texts()["context"].json
    for turn in range(1, s.turns + 1):
        body = s.request(turn).body_parts(sc)
        # Bytes this request holds of its own: everything but the session's shared context.
        size = sum(len(p) for p in body if p is not context)
        text = 0
        tally.add(size, text, +1)
        res = await client.send(url + driver.CHAT_PATH, body, headers=headers)
        tally.add(size, text, -1)
        if not res.ok:
            return res.error
    return None


async def stream_all(
    args: argparse.Namespace, sc: scenario.Scenario, sessions: Sequence[Session]
) -> None:
    tally = Tally()
    sampler = asyncio.create_task(tally.sample())
    with calibrate.ReferenceServer() as server:
        async with driver.Client(len(sessions), 30.0) as client:
            opened = await client.prewarm(server.url, len(sessions))
            print(f"connections prewarmed: {opened}; RSS {rss() / MIB:,.0f} MiB")
            start = time.perf_counter()
            errors = await asyncio.gather(
                *(run_session(client, server.url, sc, s, tally, args.hold) for s in sessions)
            )
            elapsed = time.perf_counter() - start
    sampler.cancel()
    failed = [e for e in errors if e]
    print(
        f"streamed {len(sessions)} sessions x {sc.sessions.turns} turns in {elapsed:.1f} s"
        f"{f'; {len(failed)} failed: {failed[0]}' if failed else ''}"
    )
    print(f"most requests in flight at once: {tally.max_in_flight}")
    print(
        f"  their bodies: {tally.max_bodies / MIB:,.0f} MiB; their message texts: "
        f"{tally.max_texts / MIB:,.0f} MiB"
    )
    print(f"RSS peak while streaming (sampled): {tally.max_rss / MIB:,.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--hold", type=float, default=2.0, help="server delay before streaming, s")
    args = ap.parse_args()
    raise_fd_limit(args.sessions + 256)
    print(f"RSS after imports: {rss() / MIB:,.0f} MiB")
    sc = scenario.from_dict(
        {
            "name": "memory",
            "sessions": {
                "count": args.sessions,
                "turns": args.turns,
                "initial_context_tokens": args.context,
            },
            "driver": {"concurrency": args.sessions},
        }
    )
    builder = SessionBuilder(sc, "memory")
    sessions = builder.sessions()
    print(f"RSS with the text generator: {rss() / MIB:,.0f} MiB")
    start = time.perf_counter()
    for s in sessions:  # as replay does before a block: every session's texts built
        s.request(1)
    texts = sum(len(s.texts()["context"].json) for s in sessions)
    print(
        f"built {len(sessions)} sessions of {args.context:,} tokens in "
        f"{time.perf_counter() - start:.0f} s: contexts "
        f"{texts / MIB:,.0f} MiB; RSS {rss() / MIB:,.0f} MiB"
    )
    asyncio.run(stream_all(args, sc, sessions))
    peak = peak_rss()
    print(
        f"RSS peak of the client (ru_maxrss): {peak / MIB:,.0f} MiB = {peak / GIB:.2f} GiB "
        f"({'under' if peak < 2 * GIB else 'OVER'} the 2 GiB target)"
    )


if __name__ == "__main__":
    main()
