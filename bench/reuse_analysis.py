"""Benchmark: the trace report's reuse figures on a trace of the Mooncake conversation trace's size.

    .venv/bin/python bench/reuse_analysis.py [--lines 12000] [--blocks 4] [--replicas 4]

Generates a trace of the conversation trace's shape (:func:`trace_import.write_trace`:
sessions whose turns extend their previous prompt, 8-12k input tokens), gives each of
``--blocks`` run blocks every line once, a session's turns on one replica of
``--replicas`` (as ``fixed`` places them) and sends one modeled second apart, then times
:mod:`sessiongen.analysis.reuse`: the per-replica shares, the arm table, the sliding
working set and the footprint. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_import import BLOCK, write_trace

from sessiongen.analysis import reuse
from sessiongen.workload.reuse import prefix_facts
from sessiongen.workload.trace import read_trace


def frames(path: Path, blocks: int, replicas: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(requests as the records hold them, the trace's lines with their hash ids)."""
    rows, lines = [], []
    for req, facts in prefix_facts(read_trace(path, block_tokens=BLOCK), BLOCK):
        lines.append({"trace_line": req.line, "hash_ids": list(req.hash_ids)})
        for b in range(blocks):
            rows.append(
                {
                    "block": b,
                    "placement": "fixed",
                    "cache": "on" if b % 2 else "off",
                    "session_id": str(req.session_id),
                    "replica": int(str(req.session_id)) % replicas,
                    "send_s": float(req.line),
                    "status": "ok",
                    "trace_line": req.line,
                    "content_tokens": req.input_length,
                    "trace_shared_tokens": facts.shared_tokens,
                    "trace_reuse_distance": facts.reuse_distance,
                    "local_hit_tokens": facts.shared_tokens // 2,
                    "external_hit_tokens": facts.shared_tokens // 4 if b % 2 else 0,
                }
            )
    return pl.DataFrame(rows), pl.DataFrame(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=12_000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(path, args.lines, seed=0)
        requests, lines = frames(path, args.blocks, args.replicas)
    refs = int(lines["hash_ids"].list.len().sum())
    print(f"{requests.height} requests ({args.lines} lines x {args.blocks} blocks), {refs} refs")
    t0 = time.perf_counter()
    rows = reuse.with_replica_reuse(requests, lines, BLOCK)
    t1 = time.perf_counter()
    arms = reuse.arm_reuse(rows)
    t2 = time.perf_counter()
    ws = reuse.working_set(requests, lines)
    t3 = time.perf_counter()
    reuse.footprint(requests, lines)
    reuse.distance_histogram(rows)
    t4 = time.perf_counter()
    print(f"replica shares   {t1 - t0:6.2f} s")
    print(f"arm table        {t2 - t1:6.2f} s")
    print(f"working set      {t3 - t2:6.2f} s  ({ws.height} points)")
    print(f"footprint, hist  {t4 - t3:6.2f} s")
    print(arms.select("cache", "infinite_share", "replica_share", "recovered_share"))


if __name__ == "__main__":
    main()
