"""How fast a trace's prefix-sharing facts come, compiled and in Python.

    .venv/bin/python bench/reuse_speed.py [--requests 12031] [--seed 21] [--repeat 3]

Writes :mod:`plan_trace`'s flat Mooncake-shaped trace into a temp folder, reads it once
(:func:`sessiongen.workload.trace.read_trace`, 512-token blocks), then times, in CPU
seconds (the best of ``--repeat``), :func:`~sessiongen.workload.reuse.prefix_facts` with
each engine and :func:`~sessiongen.workload.tracesessions.trace_sessions` (which calls
it) with the default one. Checks the two engines agree and prints figures; asserts
nothing else.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from plan_trace import write_trace

from sessiongen.workload.reuse import kernel, prefix_facts
from sessiongen.workload.trace import TraceRequest, read_trace
from sessiongen.workload.tracesessions import trace_sessions

BLOCK = 512


def cpu_s(work: Callable[[], object], repeat: int) -> float:
    """The least CPU time of ``repeat`` calls."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        work()
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=12031)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(path, args.requests, seed=args.seed, flat=True)
        t = time.process_time()
        requests: list[TraceRequest] = list(read_trace(path, block_tokens=BLOCK))
        read_s = time.process_time() - t
    refs = sum(len(r.hash_ids) for r in requests)
    print(f"trace: {len(requests):,} requests, {refs:,} hash-id references; read {read_s:.3f} s")
    python = list(prefix_facts(requests, BLOCK, engine="python"))
    py_s = cpu_s(lambda: list(prefix_facts(requests, BLOCK, engine="python")), args.repeat)
    print(f"prefix_facts, Python:   {py_s:.3f} s")
    if kernel() is None:
        print("prefix_facts, compiled: not built (or SESSIONGEN_ENGINE=python)")
    else:
        same = list(prefix_facts(requests, BLOCK, engine="compiled")) == python
        c_s = cpu_s(lambda: list(prefix_facts(requests, BLOCK, engine="compiled")), args.repeat)
        print(f"prefix_facts, compiled: {c_s:.3f} s ({py_s / c_s:.1f}x; same facts: {same})")
    s_s = cpu_s(lambda: trace_sessions(requests, BLOCK), args.repeat)
    print(f"trace_sessions (default engine): {s_s:.3f} s")


if __name__ == "__main__":
    main()
