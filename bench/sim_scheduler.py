"""The simulator's scheduler under load: the served simulator's own lateness with 1,000
sessions in flight, and the virtual clock's speed. Prints, asserts nothing.

    .venv/bin/python bench/sim_scheduler.py [--sessions 1000] [--scale 0.05]
        [--seconds 60] [--hours 24] [--skip-served] [--skip-virtual] [--quick] [--nice N]

Served: the simulator in its own process (as in a replay), ``--sessions`` closed-loop
sessions through :class:`sessiongen.client.driver.Client`, each on one replica, turn
after turn (a 2,000-token context growing by 32 tokens a turn, 16 streamed output
tokens), for ``--seconds``. Each response's ``sim`` facts say how late the simulator
wrote the first byte against its own deadline (``late_s``, wall seconds) and what that
deadline was (``target_ttft_s`` = modeled TTFT x time scale); the share is
``late_s / target_ttft_s``. The goal is within 1% of modeled TTFT. The simulator's
threads' time on a CPU and waiting in the run queue (``/proc/PID/task/*/schedstat``)
tell its own cost from its neighbours' share of the machine: lateness with much
run-queue wait is the machine's, not the simulator's.

Virtual: :class:`sessiongen.sim.virtual.VirtualDriver`, the planner's workload: one new
six-turn 128k session a second (Poisson) on 8 replicas, pool on, live 100-token
answers, 60 s mean think time, each session on one replica (fixed placement), its
context one of 4 shared 128k documents. That is a day the study's cluster can serve
(TTFT p50 about 0.65 s, steady hour after hour). Harder days are not: with 200-token
answers decode alone is over capacity (a 128k sequence adds 6.4 ms to every decode
step, so a replica decodes at most about 140 such tokens a second), unique 128k
contexts need 32 replicas for their cold prefills (31.7 s each), and alternating
placement needs more than the pool's 10 GB/s link (six 2 GB loads a second). Those
overloaded variants are timed over shorter windows, per request. Then how the cost
grows: with modeled hours (requests), replicas (same load per replica), context length,
and without the collapsing of steady runs. Sessions are submitted an hour of modeled time at a time,
as a planner would, so memory stays bounded. CPU seconds are the process's own
(``time.process_time``), steadier than wall time on a shared machine.

The figures depend on the machine and on what else runs on it: quote them with the
load average printed around them. On the project's busy 2-core machine (load average
4 to 9) the day took 234.7 s of CPU before the sim-perf branch (2,210 requests per CPU
second) and 147.3 s after it (3,522; 284 us a request); instruction counts
(``valgrind --tool=callgrind``, the first quarter hour, imports subtracted) fell from
7,332 M to 4,488 M. Where the rest went: the day's running batches hold 9 requests on
average (up to 40), and each request is visited about 20 times when steps are formed
and again when they end (``ReplicaScheduler.schedule``, ``complete``, ``extend``), a
few microseconds of Python each. That loop is what the compiled engine
(``sessiongen/sim/_core.pyx``) runs: an hour here went from 196 to 58 us a request,
the same requests, steps and TTFTs (2026-12-04, quiet). The engine that ran is printed
(``SESSIONGEN_ENGINE=python`` for the Python one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from _docs import record

from sessiongen.client.driver import Client
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.cache import PromptKeys
from sessiongen.sim.compiled import resolve
from sessiongen.sim.process import start_sim
from sessiongen.sim.virtual import Arrival, RequestResult, VirtualDriver

# --- served -------------------------------------------------------------------------


async def served_sessions(
    urls: list[str], sessions: int, seconds: float, context: int, max_tokens: int
) -> list[dict[str, Any]]:
    """Closed-loop sessions for ``seconds``; the ``sim`` facts of every response."""
    loop = asyncio.get_running_loop()
    facts: list[dict[str, Any]] = []
    async with Client(sessions, 30.0) as client:
        for url in urls:
            await client.prewarm(url, sessions // len(urls) + 1)
        stop = loop.time() + seconds

        async def session(i: int) -> None:
            url = urls[i % len(urls)] + "/v1/completions"
            base = list(range(i * 1_000_003 % 2**31, i * 1_000_003 % 2**31 + context))
            turn = 0
            await asyncio.sleep(2.0 * i / sessions)  # start over 2 s, not all at once
            while loop.time() < stop:
                extra = list(range(3_000_000_000 + 32 * turn, 3_000_000_000 + 32 * (turn + 1)))
                base += extra
                body = orjson.dumps(
                    {
                        "model": "sim-27b",
                        "prompt": base,
                        "max_tokens": max_tokens,
                        "ignore_eos": True,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                )
                sent_at = loop.time() - (stop - seconds)
                res = await client.send(url, body, timeout_s=600.0)
                sim = res.server_facts("sim")
                if res.ok and "late_s" in sim:
                    facts.append({**sim, "sent_at": sent_at})
                turn += 1

        await asyncio.gather(*(session(i) for i in range(sessions)))
    return facts


def pct(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else float("nan")


def report_served(facts: list[dict[str, Any]], seconds: float, scale: float) -> dict[str, float]:
    """Print the lateness of ``facts``; return its shares of the scaled modeled TTFT."""
    if not facts:
        print("  no responses")
        return {}
    share = [f["late_s"] / f["target_ttft_s"] for f in facts]
    late_ms = [1000 * f["late_s"] for f in facts]
    ttft = [f["modeled_ttft_s"] for f in facts]
    print(f"  {len(facts)} requests in {seconds:.0f} s wall ({len(facts) / seconds:.0f}/s)")
    print(
        f"  modeled TTFT s: p50 {pct(ttft, 0.5):.2f}  p90 {pct(ttft, 0.9):.2f}  "
        f"max {max(ttft):.2f}; queue p50 "
        f"{statistics.median(f['modeled_queue_s'] for f in facts):.2f} s; "
        f"preempted {sum(1 for f in facts if f['preemptions'])}"
    )
    print(
        f"  lateness ms: p50 {pct(late_ms, 0.5):.2f}  p90 {pct(late_ms, 0.9):.2f}  "
        f"p99 {pct(late_ms, 0.99):.2f}  max {max(late_ms):.2f}"
    )
    print(
        f"  lateness / (modeled TTFT x {scale}): p50 {100 * pct(share, 0.5):.3f}%  "
        f"p90 {100 * pct(share, 0.9):.3f}%  p99 {100 * pct(share, 0.99):.3f}%  "
        f"max {100 * max(share):.3f}%;  within 1%: "
        f"{100 * sum(s <= 0.01 for s in share) / len(share):.1f}% of requests"
    )
    own = [1000 * f["own_work_s"] for f in facts]
    print(f"  own work before submission ms: p50 {pct(own, 0.5):.2f}  p99 {pct(own, 0.99):.2f}")
    return {f"late_share_p{round(100 * q)}": pct(share, q) for q in (0.5, 0.9, 0.99)} | {
        "within_goal": sum(s <= 0.01 for s in share) / len(share)
    }


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of all of ``pid``'s threads."""
    run = wait = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


def bench_served(sessions: int, scale: float, seconds: float) -> dict[str, float]:
    """Print the served simulator's lateness; return its figures (all requests, steady state)."""
    print(f"served: {sessions} sessions in flight, time scale {scale}, {seconds:.0f} s")
    load = os.getloadavg()[0]
    print(f"  load average before: {load:.2f} on {os.cpu_count()} CPUs")
    with start_sim(SimProfile(time_scale=scale), "sim-27b", True) as sim:
        run0, wait0 = schedstat(sim.pid)
        wall0 = time.perf_counter()
        facts = asyncio.run(served_sessions(list(sim.urls), sessions, seconds, 2000, 16))
        wall = time.perf_counter() - wall0
        run, wait = (b - a for a, b in zip((run0, wait0), schedstat(sim.pid), strict=True))
    figures = {"sessions": sessions, "time_scale": scale, "load_before": load}
    figures |= {f"all.{k}": v for k, v in report_served(facts, seconds, scale).items()}
    steady = [f for f in facts if f["sent_at"] >= 10.0]
    print("  steady state (requests sent after the first 10 s):")
    figures |= {f"steady.{k}": v for k, v in report_served(steady, seconds - 10.0, scale).items()}
    print(
        f"  simulator process: on a CPU {run:.1f} s ({100 * run / wall:.0f}% of one), "
        f"waiting for a CPU {wait:.1f} s, over {wall:.1f} s"
    )
    print(f"  load average after: {os.getloadavg()[0]:.2f}")
    return figures


# --- virtual ------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    hours: float = 24.0
    replicas: int = 8
    rate_per_s: float = 1.0
    context: int = 128_000
    documents: int = 4  # 0: every session's context is its own
    turns: int = 6
    answer: int = 100
    question: int = 32
    think_mean_s: float = 60.0
    placement: str = "fixed"
    collapse: bool = True
    seed: int = 0


@dataclass(frozen=True)
class Outcome:
    requests: int
    events: int
    steps: int
    cpu_s: float
    wall_s: float
    modeled_end_s: float
    results: list[RequestResult]


def run_workload(w: Workload) -> Outcome:
    """Simulate ``w`` on the virtual clock; sessions are submitted an hour at a time."""
    p = SimProfile(replicas=w.replicas)
    rng = np.random.default_rng(w.seed)
    block, chunk = p.local_block_tokens, p.pool_chunk_tokens
    docs = [PromptKeys.unique(w.context, block, chunk, 10_000 + d) for d in range(w.documents)]
    prompts: dict[int, PromptKeys] = {}
    answers: dict[tuple[int, int], np.ndarray[Any, Any]] = {}
    driver = VirtualDriver(p, collapse=w.collapse)

    def submit(s: int, turn: int, at: float, prompt: PromptKeys) -> None:
        prompts[s] = prompt
        answer = rng.integers(0, 100_000, w.answer)
        answers[s, turn] = answer
        home = s if w.placement == "fixed" else s + turn
        arrival = Arrival(at, home % w.replicas, prompt, w.answer, answer, (s, turn))
        driver.submit(arrival)

    def follow(result: RequestResult) -> None:
        s, turn = result.tag
        answer = answers.pop((s, turn))
        if turn == w.turns:
            del prompts[s]
            return
        question = rng.integers(0, 100_000, w.question)
        nxt = prompts[s].extend(answer).extend(question)
        submit(s, turn + 1, result.finished_s + float(rng.exponential(w.think_mean_s)), nxt)

    driver.on_finish = follow
    end, window = w.hours * 3600.0, 3600.0
    starts = np.cumsum(rng.exponential(1.0 / w.rate_per_s, int(end * w.rate_per_s * 1.2) + 10))
    starts = starts[starts < end]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    s, t = 0, 0.0
    while t < end:
        t = min(t + window, end)
        while s < len(starts) and starts[s] < t:
            if w.documents:
                context = docs[int(rng.integers(w.documents))]
            else:
                context = PromptKeys.unique(w.context, block, chunk, s)
            submit(s, 1, float(starts[s]), context.extend(rng.integers(0, 100_000, w.question)))
            s += 1
        driver.run(until=t)
    driver.run()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return Outcome(
        len(driver.results), driver.cluster.events, driver.steps, cpu, wall, driver.now,
        driver.results,
    )  # fmt: skip


def describe(label: str, o: Outcome) -> str:
    per_req_us = 1e6 * o.cpu_s / max(o.requests, 1)
    return (
        f"  {label:<34} {o.requests:>7} req  {o.events:>8} events  {o.steps:>9} steps  "
        f"cpu {o.cpu_s:7.1f} s  wall {o.wall_s:7.1f} s  {o.requests / o.cpu_s:8.0f} req/cpu-s  "
        f"{per_req_us:6.0f} us/req"
    )


def ttft_summary(results: list[RequestResult]) -> str:
    first = [r.ttft_s for r in results if r.tag[1] == 1]
    later = [r.ttft_s for r in results if r.tag[1] > 1]
    pool = sum(r.pool_hit_tokens for r in results) / max(sum(r.prompt_tokens for r in results), 1)
    return (
        f"    modeled TTFT s: turn 1 p50 {pct(first, 0.5):.2f} p90 {pct(first, 0.9):.2f}; "
        f"later turns p50 {pct(later, 0.5):.2f} p90 {pct(later, 0.9):.2f}; "
        f"pool share of prompt tokens {100 * pool:.0f}%; "
        f"preempted {sum(1 for r in results if r.preemptions)}"
    )


def bench_virtual(hours: float, quick: bool) -> None:
    print(f"virtual clock, {resolve()} engine (load average before: {os.getloadavg()[0]:.2f})")
    day = run_workload(Workload(hours=hours))
    print(describe(f"{hours:g} h, 8 replicas, 1 session/s", day))
    print(ttft_summary(day.results))
    print(f"    modeled time simulated: {day.modeled_end_s / 3600:.2f} h")
    slice_h = 0.25 if quick else 1.0
    print("  cost against requests (modeled hours):")
    for h in (slice_h, 2 * slice_h, 4 * slice_h):
        print(describe(f"{h:g} h", run_workload(Workload(hours=h))))
    print("  cost against replicas (0.125 sessions/s per replica):")
    for n in (2, 4, 8, 16):
        w = Workload(hours=slice_h, replicas=n, rate_per_s=n / 8)
        print(describe(f"{n} replicas", run_workload(w)))
    print("  cost against context (1 session/s, 8 replicas):")
    for ctx in (8_000, 32_000, 128_000):
        print(
            describe(f"{ctx // 1000}k context", run_workload(Workload(hours=slice_h, context=ctx)))
        )
    print("  collapsing steady runs:")
    print(describe("no collapsing", run_workload(Workload(hours=slice_h / 4, collapse=False))))
    print(describe("collapsing", run_workload(Workload(hours=slice_h / 4))))
    print("  overloaded clusters (the backlog drains long after the arrivals stop):")
    for label, w in (
        (
            "16 documents, alternating",
            Workload(hours=slice_h / 2, documents=16, placement="alternate"),
        ),
        ("unique contexts, fixed", Workload(hours=slice_h / 2, documents=0)),
        (
            "unique contexts, alternating",
            Workload(hours=slice_h / 2, documents=0, placement="alternate"),
        ),
    ):
        o = run_workload(w)
        print(describe(label, o))
        print(f"    arrivals for {w.hours:g} h drain at {o.modeled_end_s / 3600:.1f} modeled h")
    print(f"  load average after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--skip-virtual", action="store_true")
    parser.add_argument("--quick", action="store_true", help="shorter scaling runs")
    parser.add_argument(
        "--nice", type=int, default=0, help="niceness for the bench and the simulator (root: < 0)"
    )
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)  # the simulator process inherits it
    if not args.skip_served:
        figures = bench_served(args.sessions, args.scale, args.seconds)
        # the served figures are the documented ones whatever the virtual part did
        documented = parser.parse_args([])
        for name in ("skip_virtual", "quick", "hours"):
            setattr(documented, name, getattr(args, name))
        record("sim_scheduler", figures, args=args, documented=documented)
    if not args.skip_virtual:
        bench_virtual(args.hours, args.quick)


if __name__ == "__main__":
    main()
