"""How fast the planner runs a day of traffic, on which engine, and where the time goes.

    .venv/bin/python bench/plan_speed.py [--hours 1] [--full-day] [--engine both]
        [--skip-parts] [--skip-growth]

The day is ``scenarios/day128k.toml``: one new six-turn session a second (Poisson) on
8 replicas, every session asking about one shared 128k-token document, a minute's
think time, 100-token answers, pool on (one block; the scenario's OFF block doubles
it). ``--hours`` plans that many modeled hours (3,600 sessions an hour) and
extrapolates to 24; ``--full-day`` plans all 86,400 sessions. ``--engine`` picks the
compiled engine, the pure-Python one or both in turn (``SESSIONGEN_ENGINE``); both
give the same records, which this script checks on the run it timed.

Then where one engine's time goes (``--skip-parts`` skips it), by timers wrapped around
the planner's pieces, on a run as long: the sessions' prompts (shaped turns and
think times), submitting (hashing the keys, handing them to the engine), the engine
itself (its steps; the callbacks it makes are counted where they belong), the records
(a row per finished request) and the rest (the planner's event loop, start-up, the
frame). The wrappers cost a little; their total is printed beside the unwrapped one.
Then how the cost per request grows with replicas (at the same load per replica),
context length and arrival rate, on the compiled engine.

CPU seconds are the process's own (``time.process_time``, user plus system), steadier
than wall time on a shared machine; the load average is printed beside them. System
time is mostly first touches of fresh memory (page faults), printed apart.

Prints, asserts nothing: the figures depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen import scenario
from sessiongen.capacity import virtual as planner
from sessiongen.experiment import script
from sessiongen.records.run import load_run
from sessiongen.sim import compiled
from sessiongen.sim import virtual as sim_virtual

DAY = Path(__file__).resolve().parent.parent / "scenarios" / "day128k.toml"


def plan_once(overrides: list[str], engine: str) -> tuple[float, float, pl.DataFrame]:
    """(CPU s, wall s, measured rows) of one planned block on ``engine``."""
    os.environ[compiled.ENV] = engine
    sc = scenario.load(DAY, ['design.blocks=["on"]', *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        cpu, wall = time.process_time(), time.monotonic()
        run_dir = planner.virtual_replay(sc, Path(tmp), run_id="speed", tokens="shape")
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        ok = load_run(run_dir).ok
    return cpu, wall, ok


def describe(label: str, cpu: float, wall: float, requests: int) -> str:
    per = cpu / max(requests, 1) * 1e6
    return (
        f"{label:<44} {requests:>8,} requests  {cpu:7.1f} s CPU  {wall:7.1f} s wall  "
        f"{per:6.0f} us CPU/request"
    )


# --- where the time goes -----------------------------------------------------------------


class Parts:
    """CPU seconds spent inside wrapped methods, callbacks subtracted from their caller."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []

    def wrap(self, owner: Any, name: str, part: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([time.process_time(), 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                began, inner = self._stack.pop()
                spent = time.process_time() - began
                self.seconds[part] = self.seconds.get(part, 0.0) + spent - inner
                if self._stack:
                    self._stack[-1][1] += spent

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)


@contextmanager
def timed_parts(parts: Parts) -> Iterator[None]:
    undo = [
        parts.wrap(planner.Prompts, "turns", "sessions' prompts"),
        parts.wrap(script.BlockScript, "start_next", "sessions' prompts"),
        parts.wrap(sim_virtual.VirtualDriver, "submit", "submitting (keys, hashing)"),
        parts.wrap(sim_virtual.VirtualDriver, "run", "engine"),
        parts.wrap(planner.VirtualBlock, "_done", "records and next turns"),
    ]
    try:
        yield
    finally:
        for restore in undo:
            restore()


def where_time_goes(hours: float, engine: str) -> None:
    sessions = int(3600 * hours)
    cpu, _wall, ok = plan_once([f"sessions.count={sessions}"], engine)
    parts = Parts()
    with timed_parts(parts):
        wrapped, _wall, _ = plan_once([f"sessions.count={sessions}"], engine)
    per = 1e6 / ok.height
    print(
        f"where the time goes ({engine} engine, {hours:g} modeled h, {ok.height:,} requests; "
        f"{cpu:.1f} s CPU unwrapped, {wrapped:.1f} s wrapped):"
    )
    named = sum(parts.seconds.values())
    for part, seconds in [*parts.seconds.items(), ("the rest", wrapped - named)]:
        print(f"  {part:<30} {seconds:6.2f} s  {seconds * per:6.1f} us/request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--full-day", action="store_true")
    parser.add_argument("--engine", choices=["compiled", "python", "both"], default="both")
    parser.add_argument("--skip-parts", action="store_true")
    parser.add_argument("--skip-growth", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    hours = 24.0 if args.full_day else args.hours
    sessions = int(3600 * hours)
    engines = ["compiled", "python"] if args.engine == "both" else [args.engine]
    frames: dict[str, pl.DataFrame] = {}
    # What a process pays once (imports of the planner's parts, the tokenizer's tables,
    # the first session prepared exactly), so that the runs below compare engines.
    cpu, _wall, _ = plan_once(["sessions.count=10"], engines[0])
    print(f"start-up (a 10-session plan): {cpu:.1f} s CPU")
    for engine in engines:
        before = resource.getrusage(resource.RUSAGE_SELF)
        cpu, wall, ok = plan_once([f"sessions.count={sessions}"], engine)
        frames[engine] = ok.drop("run_id")
        print(describe(f"day128k, {hours:g} modeled h, {engine} engine", cpu, wall, ok.height))
        ttft = ok["ttft_s"].quantile(0.5), ok["ttft_s"].quantile(0.9)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"  modeled TTFT p50 {ttft[0]:.3f} s, p90 {ttft[1]:.3f} s; peak memory of the "
            f"process so far {usage.ru_maxrss / 1024:.0f} MB; this run "
            f"{usage.ru_utime - before.ru_utime:.1f} s user + "
            f"{usage.ru_stime - before.ru_stime:.1f} s system "
            f"({usage.ru_minflt - before.ru_minflt:,} page faults)"
        )
        if not args.full_day:
            print(f"  a day (24 h) at this rate: {cpu * 24 / hours:.0f} s CPU per block")
    if len(frames) == 2:
        same = frames["compiled"].equals(frames["python"])
        print(f"  the two engines' records: {'identical' if same else 'DIFFERENT'}")
    if not args.skip_parts:
        for engine in engines:
            where_time_goes(hours, engine)
    if not args.skip_growth:
        print("cost per request as the day grows (30 modeled minutes each, compiled engine):")
        base = ["sessions.count=1800"]
        for replicas in (2, 4, 8, 16):
            rate = replicas / 8  # the same load per replica
            cpu, wall, ok = plan_once(
                [*base, f"target.sim.replicas={replicas}", f"load.levels=[{rate}]"], "compiled"
            )
            print(describe(f"  {replicas} replicas, {rate:g} sessions/s", cpu, wall, ok.height))
        for document in (8192, 32768, 131072):
            cpu, wall, ok = plan_once(
                [*base, f"sessions.shared_prefix_tokens={document}"], "compiled"
            )
            print(describe(f"  shared document of {document} tokens", cpu, wall, ok.height))
        cpu, wall, ok = plan_once(
            [*base, "sessions.shared_prefix_tokens=0", "sessions.initial_context_tokens=32768",
             "load.levels=[0.05]"], "compiled",
        )  # fmt: skip
        print(describe("  unique 32k contexts, 0.05 sessions/s", cpu, wall, ok.height))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
