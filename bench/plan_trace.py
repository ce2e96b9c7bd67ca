"""How fast the planner plans a trace of the Mooncake conversation trace's size and shape.

    .venv/bin/python bench/plan_trace.py [--requests 12000] [--replicas 8] \\
        [--exact-requests 1500]

Writes a generated Mooncake-style trace into a temp folder: an hour of multi-turn
sessions (Poisson starts; 1-6 turns, each extending the previous prompt by its answer
and a question, the next sent a think time after the answer), some sessions starting
from one of a few shared system prompts, about 12k input tokens and a few hundred
output tokens a request on average, as the published conversation trace (12k requests
in an hour, 12k tokens on average). Then plans one block of it (pool on, fixed
placement by session) on the virtual clock, in ``shape`` mode (prompts made from the
hash ids, untokenized) and, on the first ``--exact-requests`` requests, in ``exact``
mode (token-exact prompts through the tokenizer). For each: the CPU time
(``time.process_time``) of importing the trace (reading it into sessions) and of
preparing every prompt, each alone, then of the whole planned block and the part of it
that is not prompt preparation (its own import, the engine's replay, the records), per
request. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from sessiongen import scenario
from sessiongen.capacity.virtual import Prompts, Tokens, Turn, virtual_replay
from sessiongen.records.run import load_run
from sessiongen.sim.engine import World
from sessiongen.workload.sessions import Session

BLOCK = 512
HOUR_MS = 3_600_000.0


def write_trace(path: Path, requests: int, seed: int) -> float:
    """The trace (module doc); returns its mean input length."""
    rng = np.random.default_rng(seed)
    systems = [list(range(10 * i, 10 * i + int(rng.integers(2, 10)))) for i in range(4)]
    next_id = 1000
    sessions: list[list[dict[str, object]]] = []
    written = 0
    while written < requests:
        own = list(systems[int(rng.integers(0, 4))]) if rng.random() < 0.6 else []
        length = len(own) * BLOCK + int(rng.integers(3000, 15000))
        ids = own
        turns: list[dict[str, object]] = []
        for turn in range(min(int(rng.integers(1, 7)), requests - written)):
            if turn:  # the answer and a question: whole blocks stay, the last one changes
                ids = ids[: length // BLOCK]
                length += int(rng.integers(400, 1200))
            while len(ids) < -(-length // BLOCK):
                ids.append(next_id)
                next_id += 1
            row: dict[str, object] = {"session_id": f"s{len(sessions)}"}
            if turn:
                row["delay"] = round(float(rng.exponential(30_000.0)), 1)
            row.update(
                input_length=length,
                output_length=int(rng.integers(100, 600)),
                hash_ids=list(ids),
            )
            turns.append(row)
            written += 1
        sessions.append(turns)
    starts = np.sort(rng.uniform(0, 0.85 * HOUR_MS, len(sessions)))
    total = 0
    lines: list[tuple[float, bytes]] = []
    for start, turns in zip(starts, sessions, strict=True):
        turns[0]["timestamp"] = round(float(start), 1)
        for row in turns:
            total += int(row["input_length"])  # type: ignore[call-overload]
        # A session's lines in order, sessions by their start (later turns only have a
        # delay: the reader places them after the previous answer).
        lines += [(float(start), orjson.dumps(row)) for row in turns]
    with path.open("wb") as fh:
        for _start, line in sorted(lines, key=lambda item: item[0]):
            fh.write(line + b"\n")
    return total / requests


SCENARIO = """
name = "plan-trace-bench"
seed = 21

[model]
tokenizer = "cl100k"

[sessions]
source = "trace"
answer_tokens = 16

[sessions.trace]
file = "trace.jsonl"
block_tokens = {block}
limit = {limit}

[placement]
policies = ["fixed"]

[design]
cache = ["on"]
blocks = ["on"]

[target]
kind = "sim"

[target.sim]
replicas = {replicas}
time_scale = 1.0
"""


def measure(folder: Path, tokens: Tokens, limit: int, replicas: int) -> None:
    toml = folder / f"{tokens}.toml"
    toml.write_text(SCENARIO.format(block=BLOCK, limit=limit, replicas=replicas))
    cpu = time.process_time()
    sc = scenario.load(toml)
    world = World(sc.target.sim, sc.model.name, shared_cache=True)
    prompts = Prompts(sc, world, "bench", tokens)
    imported = time.process_time() - cpu
    requests = sum(s.turns for s in prompts.sessions)
    cpu = time.process_time()
    for session in prompts.sessions:
        prompts.turns(session)
        session.forget()
    prepared = time.process_time() - cpu
    spent = [0.0]  # CPU seconds in prompt preparation during the plan itself
    turns = Prompts.turns

    def timed(self: Prompts, session: Session) -> list[Turn]:
        start = time.process_time()
        try:
            return turns(self, session)
        finally:
            spent[0] += time.process_time() - start

    Prompts.turns = timed  # type: ignore[method-assign]
    cpu = time.process_time()
    try:
        run_dir = virtual_replay(sc, folder / f"runs-{tokens}", tokens=tokens)
    finally:
        Prompts.turns = turns  # type: ignore[method-assign]
    total = time.process_time() - cpu
    rows = load_run(run_dir).ok.filter(~pl.col("warmup"))
    rest = total - spent[0]
    per = 1e6 / max(requests, 1)
    print(
        f"{tokens:>5}: {requests:>6,} requests, {len(prompts.sessions):,} sessions "
        f"({prompts.mode}); CPU: trace import {imported:5.1f} s ({imported * per:4.0f} us/req), "
        f"prompts alone {prepared:5.1f} s ({prepared * per:5.0f} us/req); whole plan "
        f"{total:5.1f} s ({total * per:5.0f} us/req): prompts {spent[0]:5.1f} s, import, "
        f"engine and records {rest:5.1f} s ({rest * per:4.0f} us/req)"
    )
    ttft = rows["ttft_s"]
    hits = int((rows["local_hit_tokens"] + rows["external_hit_tokens"]).sum())
    share = hits / max(int(rows["prompt_tokens"].sum()), 1)
    print(
        f"       modeled TTFT p50 {ttft.quantile(0.5):.3f} s, p90 {ttft.quantile(0.9):.3f} s; "
        f"hit share {share:.1%}; peak RSS so far "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--exact-requests", type=int, default=1500)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        mean = write_trace(folder / "trace.jsonl", args.requests, seed=21)
        print(f"trace: {args.requests:,} requests, {mean:,.0f} input tokens on average")
        measure(folder, "shape", args.requests, args.replicas)
        if args.exact_requests:
            measure(folder, "exact", args.exact_requests, args.replicas)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
