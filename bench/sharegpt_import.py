"""Benchmark: how fast a ShareGPT-shaped dataset becomes sessions (read, checked, counted).

    .venv/bin/python bench/sharegpt_import.py [--conversations 5000] [--turns 6] [--words 120]

Writes a generated JSONL dataset into a temp folder (``--conversations`` conversations of
``--turns`` question/answer pairs, each text ``--words`` words of the workload's prose),
then times :func:`sessiongen.workload.sharegpt.read_conversations` alone (read and
checked) and a :class:`~sessiongen.workload.sessions.SessionBuilder` on a scenario
naming the file (read, checked, every turn's prompt counted under cl100k), and once with
``pad_first_to`` set. Prints figures; asserts nothing. Run with the defaults, it writes
them to ``docs/data/sharegpt_import.json`` (the Replay a trace page quotes them).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from _docs import record

from sessiongen import scenario
from sessiongen.workload.sessions import SessionBuilder
from sessiongen.workload.sharegpt import read_conversations
from sessiongen.workload.textgen import default_generator


def write_dataset(path: Path, conversations: int, turns: int, words: int) -> int:
    gen = default_generator()
    rng = np.random.default_rng(21)
    with path.open("wb") as fh:
        for i in range(conversations):
            conv = []
            for _ in range(turns):
                conv.append({"from": "human", "value": gen.prose(rng, words).strip()})
                conv.append({"from": "gpt", "value": gen.prose(rng, 2 * words).strip()})
            fh.write(orjson.dumps({"id": f"b{i}", "conversations": conv}) + b"\n")
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=5000)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--words", type=int, default=120)
    args = ap.parse_args()
    figures: dict[str, float] = {"conversations": args.conversations, "turns": args.turns}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "bench.jsonl"
        size = write_dataset(data, args.conversations, args.turns, args.words)
        t0 = time.perf_counter()
        n = sum(1 for _ in read_conversations(data))
        read_s = time.perf_counter() - t0
        print(f"dataset: {n} conversations x {args.turns} turns, {size / 2**20:.1f} MiB JSONL")
        print(f"read and checked: {read_s:.2f} s ({n / read_s:,.0f} conversations/s)")
        figures["read_s"] = read_s
        toml = Path(tmp) / "s.toml"
        toml.write_text(
            f'name = "bench"\n[sessions]\nsource = "sharegpt"\n'
            f'[sessions.sharegpt]\nfile = "{data}"\n'
        )
        for extra in ([], ["sessions.sharegpt.pad_first_to=32768"]):
            sc = scenario.load(toml, extra)
            t0 = time.perf_counter()
            builder = SessionBuilder(sc, "bench")
            sessions = builder.sessions()
            build_s = time.perf_counter() - t0
            tokens = sum(s.chat.turns[-1].prompt_tokens for s in sessions if s.chat)
            label = " ".join(extra) or "no padding"
            figures["build_padded_s" if extra else "build_s"] = build_s
            print(
                f"sessions built ({label}): {build_s:.2f} s for {len(sessions)} sessions, "
                f"{tokens:,} last-turn prompt tokens ({tokens / build_s:,.0f} tokens/s counted)"
            )
    record("sharegpt_import", figures, args=args, documented=ap.parse_args([]))


if __name__ == "__main__":
    main()
