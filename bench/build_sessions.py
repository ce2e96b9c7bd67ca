"""Benchmark: how fast the session builder makes exact tokens, and its peak memory.

    .venv/bin/python bench/build_sessions.py [--sessions 16] [--context 131072] [--turns 6]

Prints exact (unique, token-counted) tokens generated per second on one core, the
content tokens of all requests, and peak RSS / traced allocations.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from sessiongen import scenario
from sessiongen.workload import sessions
from sessiongen.workload.textgen import default_generator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--turns", type=int, default=6)
    args = ap.parse_args()
    t = time.perf_counter()
    gen = default_generator()
    setup_s = time.perf_counter() - t
    sc = scenario.from_dict(
        {
            "name": "bench",
            "sessions": {
                "count": args.sessions,
                "turns": args.turns,
                "initial_context_tokens": args.context,
                "probe": "needle",
            },
        }
    )
    t = time.perf_counter()
    builder = sessions.SessionBuilder(sc, "bench", gen)
    unique = 0
    content = 0
    for s in builder.sessions():
        last = None
        for req in s.requests():
            content += req.content_tokens
            last = req
        assert last is not None
        spec = sc.sessions
        unique += s.context_tokens + spec.turns * spec.question_tokens
        unique += (spec.turns - 1) * spec.answer_tokens
    elapsed = time.perf_counter() - t
    # Memory in a second pass: tracemalloc slows allocation-heavy code several-fold.
    tracemalloc.start()
    for s in sessions.SessionBuilder(sc, "bench-mem", gen).sessions():
        for _req in s.requests():
            pass
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"generator setup: {setup_s:.2f} s (once per process)")
    print(f"sessions: {args.sessions} x {args.turns} turns from {args.context} tokens")
    print(
        f"unique exact tokens: {unique:,} in {elapsed:.2f} s"
        f" = {unique / elapsed / 1e6:.2f} M tokens/s"
    )
    print(f"request content tokens (all turns): {content:,}")
    print(
        f"peak traced allocations (all sessions kept): {peak / 2**20:.0f} MiB;"
        f" peak RSS: {rss_mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()
