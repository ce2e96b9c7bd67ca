"""Benchmark: how fast the Mooncake-style trace reader streams a large trace, in how much memory.

    .venv/bin/python bench/trace_import.py [--lines 1000000] [--prompts 2000] [--facts 24000]

Writes a generated trace of the Mooncake conversation trace's shape into a temp folder
(multi-turn sessions whose turns extend their previous prompt, 8-12k input tokens, a
shared system prompt, Poisson starts), then reads it back with
:func:`sessiongen.workload.trace.read_trace`, once untraced for speed and once under
tracemalloc for the peak of Python allocations; then gets the prefix-sharing facts of
the first ``--facts`` requests (:func:`~sessiongen.workload.reuse.prefix_facts`, about
the Mooncake conversation trace's size twice over) and builds the token-exact prompts of
the first ``--prompts`` requests (:class:`~sessiongen.workload.traceprompts.TracePrompts`).
Prints figures; asserts nothing. Run with the defaults, it writes the reading figures to
``docs/data/trace_import.json`` (the Replay a trace page quotes them).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
from _docs import record

from sessiongen.workload.reuse import prefix_facts
from sessiongen.workload.textgen import default_generator
from sessiongen.workload.trace import read_trace
from sessiongen.workload.traceprompts import TracePrompts

BLOCK = 512


def write_trace(path: Path, lines: int, seed: int) -> None:
    """Sessions of 1-8 turns; each turn's prompt is the previous one plus 300-900 tokens."""
    rng = np.random.default_rng(seed)
    next_id = 20  # ids 0..19: a 10k-token system prompt some sessions share
    ts = 0.0
    written = 0
    session = 0
    with path.open("wb") as fh:
        while written < lines:
            ts += float(rng.exponential(300.0))
            shared = int(rng.integers(0, 20)) if rng.random() < 0.5 else 0
            length = shared * BLOCK + int(rng.integers(2000, 10000))
            ids = list(range(shared))
            for turn in range(int(rng.integers(1, 9))):
                if turn:
                    # The prompt grows by the answer and a question: its whole blocks
                    # stay, the last (partial) one changes.
                    ids = ids[: length // BLOCK]
                    length += int(rng.integers(300, 900))
                want = -(-length // BLOCK)
                while len(ids) < want:
                    ids.append(next_id)
                    next_id += 1
                row: dict[str, object] = {"session_id": session}
                if turn:
                    row["delay"] = round(float(rng.exponential(20_000.0)), 1)
                else:
                    row["timestamp"] = round(ts, 1)
                row.update(
                    input_length=length,
                    output_length=int(rng.integers(20, 600)),
                    hash_ids=ids,
                )
                fh.write(orjson.dumps(row) + b"\n")
                written += 1
                if written == lines:
                    break
            session += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--facts", type=int, default=24_000, help="requests to get reuse facts of")
    args = ap.parse_args()
    figures: dict[str, float] = {"lines": args.lines}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        t = time.perf_counter()
        write_trace(path, args.lines, seed=21)
        size = os.path.getsize(path)
        print(
            f"trace: {args.lines:,} lines, {size / 2**20:.0f} MiB, written in "
            f"{time.perf_counter() - t:.1f} s"
        )

        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        n = tokens = 0
        for req in read_trace(path):
            n += 1
            tokens += req.input_length
        read_s = time.perf_counter() - t
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            f"read: {n:,} requests ({tokens / n:,.0f} input tokens on average) in {read_s:.1f} s"
            f" = {n / read_s:,.0f} lines/s = {size / 2**20 / read_s:.0f} MiB/s"
        )
        print(f"peak RSS: {rss1 / 1024:.0f} MiB after reading (was {rss0 / 1024:.0f} MiB before)")
        figures |= {"size_mib": size / 2**20, "read_s": read_s, "peak_rss_mib": rss1 / 1024}

        tracemalloc.start()
        for _req in read_trace(path):
            pass
        _now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"peak traced Python allocations while reading: {peak / 2**20:.2f} MiB")

        t = time.perf_counter()
        facts = [f for _r, f in prefix_facts(read_trace(path, limit=args.facts), BLOCK)]
        facts_s = time.perf_counter() - t
        shared = [f.reuse_distance for f in facts if f.reuse_distance is not None]
        print(
            f"reuse facts: {len(facts):,} requests in {facts_s:.1f} s; "
            f"{len(shared):,} share a prefix, median reuse distance "
            f"{int(np.median(shared)) if shared else 0:,} blocks"
        )

        prompts = TracePrompts(default_generator(), seed=0, salt="bench", block_tokens=BLOCK)
        t = time.perf_counter()
        built = 0
        for req in read_trace(path, limit=args.prompts):
            built += len(prompts.text(req))
        build_s = time.perf_counter() - t
        print(
            f"prompts: {args.prompts:,} token-exact prompts built in {build_s:.1f} s "
            f"({args.prompts / build_s:,.0f}/s, {built / 2**20:.0f} MiB of text)"
        )
    record("trace_import", figures, args=args, documented=ap.parse_args([]))


if __name__ == "__main__":
    main()
