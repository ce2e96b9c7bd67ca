"""How fast the planner plans a trace of the Mooncake conversation trace's size and shape.

    .venv/bin/python bench/plan_trace.py [--requests 12031] [--replicas 8] [--repeat 2] \\
        [--against dynamo [--dynamo-python PYTHON]] [--parts [--exact-requests 1500]]

Writes a generated Mooncake-style trace into a temp folder: an hour of conversations
(Poisson starts; 1-6 turns, each extending the previous prompt by its answer and a
question, the next sent a think time after the answer), some starting from one of a few
shared system prompts, about 12k input tokens and a few hundred output tokens a request,
as the published conversation trace (12k requests in an hour, 12k tokens on average).
By default the trace is flat, as the published one: no session ids, every request at its
own timestamp (:func:`write_trace`'s ``flat``).

Then runs ``sessiongen plan`` on it end to end, each case once to warm up (bytecode
written, the files cached: :data:`CHILD_ENV`) and then ``--repeat`` times in a child
process (``--tokens shape --jobs 1 --no-sensitivity``; fixed placement, which on a trace
without sessions is round-robin over the 8 replicas): one cache arm, both arms with the
decision, and both arms with ``--seeds 3``; then ``default``, the plan as a user types it
(both arms, every other option at its default: tokens, jobs, seeds, the decision and its
sensitivity), and its wall time over one arm's (``--default-only``: those two alone,
written to docs/data/plan-trace-default.json). For each: wall time, CPU time and peak RSS
of the child (``os.wait4``), and the stages the plan prints with ``--verbose`` (the
quickest run's). Then one block planned in this process with its parts timed apart (the
trace read into sessions, every prompt's shape keys alone, the whole block and what of
it is not prompts), which the plan's own stages cannot split yet.

``--against dynamo``: NVIDIA Dynamo's offline replay (``dynamo.replay.run_trace_replay``:
the mocker engine, ``--replicas`` workers, round-robin routing, the trace's block size)
on the same file, timed the same way in a child of ``--dynamo-python`` (default: this
interpreter; skipped with a line when it cannot import Dynamo), and Dynamo's time over
the plan's (above 1: the plan is faster) for one arm and for both arms with the decision.

``--parts``: only the in-process split, on the trace with sessions, in ``shape`` mode
and, on the first ``--exact-requests`` requests, ``exact`` mode (token-exact prompts).

The documented run (no options, or only ``--against dynamo`` and its interpreter)
writes its figures to docs/data/plan-trace.json with the load average. Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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


def write_trace(path: Path, requests: int, seed: int, *, flat: bool = False) -> float:
    """The trace (module doc); returns its mean input length. ``flat``: as the published
    conversation trace, no sessions: every request its own line at its own timestamp
    (a later turn at the previous one's plus its delay), no session ids."""
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
        if flat:
            at = float(start)
            for row in turns:
                at += float(row.pop("delay", 0.0))  # type: ignore[arg-type]
                del row["session_id"]
                row["timestamp"] = round(at, 1)
            lines += [(float(r["timestamp"]), orjson.dumps(r)) for r in turns]  # type: ignore[arg-type]
            continue
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


def measure(folder: Path, tokens: Tokens, limit: int, replicas: int) -> dict[str, float]:
    """One block planned in this process, its parts timed apart (module doc); CPU seconds."""
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
    return {
        f"parts.{tokens}.trace_read_cpu_s": round(imported, 2),
        f"parts.{tokens}.prompts_alone_cpu_s": round(prepared, 2),
        f"parts.{tokens}.plan_cpu_s": round(total, 2),
        f"parts.{tokens}.plan_prompts_cpu_s": round(spent[0], 2),
        f"parts.{tokens}.engine_and_records_cpu_s": round(rest, 2),
    }


#: The end-to-end cases: (name, cache arms, plan options). A trace with no sessions
#: placed ``fixed`` (request i on replica i mod N) is round-robin.
CASES = (
    ("one_arm", '["on"]', ["--seeds", "1"]),
    ("both_arms", '["off", "on"]', ["--seeds", "1"]),
    ("seeds3", '["off", "on"]', ["--seeds", "3"]),
)
#: The plan as a user types it: both arms, every default (tokens, jobs, seeds, the
#: decision and its sensitivity), timed beside the cases above.
DEFAULT_CASE = ("default", '["off", "on"]')
STAGE_LINE = re.compile(r"^stage (.+): ([0-9.]+) s wall, ([0-9.]+) s CPU")
DYNAMO = """
import sys
from dynamo.replay.api import run_trace_replay
report = run_trace_replay(sys.argv[1], num_workers=int(sys.argv[2]), router_mode="round_robin",
                          trace_block_size=int(sys.argv[3]),
                          extra_engine_args={"engine": {"block_size": int(sys.argv[3])}})
print("completed", report.summary["completed_requests"], "of", report.summary["num_requests"])
"""


#: The children's environment: bytecode written and read as an installed tool's is
#: (``PYTHONDONTWRITEBYTECODE`` set in a shell made every run compile the project's own
#: modules again, 0.14 s of a one-arm plan; Dynamo's wheels were compiled at install).
#: The first run of each case is a warm-up, not counted, which writes what is missing.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


@dataclass(frozen=True)
class Timed:
    """One child process: its wall, CPU (user + system, its children included) and peak
    RSS, and the stages it printed (``plan --verbose``)."""

    wall_s: float
    cpu_s: float
    peak_mib: float
    stages: dict[str, tuple[float, float]]
    load: float


def timed(argv: list[str], cwd: Path) -> Timed:
    """Run ``argv`` to its end and measure it (:class:`Timed`); its output is dropped
    but for the stage lines, and a failure raises with its last lines."""
    load = os.getloadavg()[0]
    wall = time.perf_counter()
    child = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=CHILD_ENV
    )
    assert child.stdout is not None
    out = child.stdout.read()
    # wait4 rather than Popen.wait: this child's own resource usage, not every child's
    _pid, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - wall
    text = out.decode(errors="replace")
    if child.returncode:
        raise SystemExit(f"{argv[:3]} failed:\n{text[-2000:]}")
    stages = {}
    for line in text.splitlines():
        if m := STAGE_LINE.match(line):
            stages[m[1]] = (float(m[2]), float(m[3]))
    return Timed(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, stages, load)


def default_argv(toml: Path, runs: Path, cache: str) -> list[str]:
    """``sessiongen plan`` with nothing but the arms, the folder and the stage timings."""
    return [
        sys.executable, "-m", "sessiongen", "plan", str(toml), "--no-progress", "--verbose",
        "--runs-dir", str(runs), "--set", f"design.cache={cache}",
        "--set", f"design.blocks={cache}",
    ]  # fmt: skip


def plan_argv(toml: Path, runs: Path, cache: str, options: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "sessiongen", "plan", str(toml), "--tokens", "shape",
        "--jobs", "1", "--no-progress", "--no-sensitivity", "--verbose",
        "--runs-dir", str(runs), "--set", f"design.cache={cache}",
        "--set", f"design.blocks={cache}", *options,
    ]  # fmt: skip


def show(name: str, runs: list[Timed]) -> dict[str, float]:
    """Print a case's runs and its quickest run's stages; its figures, flat."""
    best = min(runs, key=lambda t: t.wall_s)
    walls = ", ".join(f"{t.wall_s:.2f}" for t in runs)
    print(
        f"{name}: wall {walls} s; quickest: CPU {best.cpu_s:.2f} s, peak RSS "
        f"{best.peak_mib:.0f} MiB (load average {best.load:.2f} at its start)"
    )
    figures = {
        f"{name}.wall_s": round(best.wall_s, 2),
        f"{name}.wall_max_s": round(max(t.wall_s for t in runs), 2),
        f"{name}.cpu_s": round(best.cpu_s, 2),
        f"{name}.peak_mib": round(best.peak_mib),
        f"{name}.load": round(best.load, 2),
        f"{name}.runs": len(runs),
    }
    for stage_name, (wall, cpu) in best.stages.items():
        print(f"    {wall:7.3f} s wall {cpu:7.3f} s CPU  {stage_name}")
        figures[f"{name}.stage.{stage_name}"] = round(wall, 3)
    return figures


def dynamo_available(python: str) -> str | None:
    """None when ``python`` imports Dynamo's replay, else the reason it does not."""
    try:
        probe = subprocess.run(
            [python, "-c", "import dynamo.replay.api"], capture_output=True, text=True, check=False
        )
    except OSError as exc:  # no such interpreter
        return str(exc)
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or ["exit status " + str(probe.returncode)])[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12_031)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each case (the quickest kept)")
    ap.add_argument("--against", choices=["dynamo"], help="also time Dynamo's offline replay")
    ap.add_argument("--dynamo-python", default=sys.executable, help="the interpreter with Dynamo")
    ap.add_argument("--parts", action="store_true", help="the in-process split of one block")
    ap.add_argument("--exact-requests", type=int, default=1500, help="with --parts")
    ap.add_argument(
        "--default-only",
        action="store_true",
        help="only one arm and the default plan (docs/data/plan-trace-default.json)",
    )
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    figures: dict[str, float | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.parts:
            write_trace(folder / "trace.jsonl", args.requests, seed=21)
            measure(folder, "shape", args.requests, args.replicas)
            if args.exact_requests:
                measure(folder, "exact", args.exact_requests, args.replicas)
            return
        mean = write_trace(folder / "trace.jsonl", args.requests, seed=21, flat=True)
        print(
            f"trace: {args.requests:,} requests, no sessions, {mean:,.0f} input tokens on average"
        )
        toml = folder / "plan.toml"
        toml.write_text(SCENARIO.format(block=BLOCK, limit=args.requests, replicas=args.replicas))
        chosen = CASES[:1] if args.default_only else CASES
        cases = [(n, plan_argv(toml, folder / "runs", c, o)) for n, c, o in chosen]
        cases.append((DEFAULT_CASE[0], default_argv(toml, folder / "runs", DEFAULT_CASE[1])))
        for name, argv in cases:
            timed(argv, Path.cwd())  # the warm-up (CHILD_ENV)
            runs = [timed(argv, Path.cwd()) for _ in range(args.repeat)]
            figures |= show(name, runs)
        ratio = float(figures["default.wall_s"]) / float(figures["one_arm.wall_s"])
        figures["ratio.default_over_one_arm"] = round(ratio, 2)
        print(f"the default plan over one arm without sensitivity: {ratio:.2f}x wall")
        if not args.default_only:
            print("one block in this process, its parts apart (the plan cannot split them yet):")
            figures |= measure(folder, "shape", args.requests, args.replicas)
            if args.against == "dynamo":
                figures |= against_dynamo(args, folder, figures)
    print(f"load average after: {os.getloadavg()}")
    # a sibling bench script; imported here, as tests import write_trace from bench.plan_trace
    from _docs import record

    documented = ap.parse_args(["--default-only"] if args.default_only else [])
    documented.against, documented.dynamo_python = args.against, args.dynamo_python
    # the command as recorded names the interpreter by its role: its path is this machine's
    sys.argv = [a.replace(args.dynamo_python, "DYNAMO_PYTHON") for a in sys.argv]
    name = "plan-trace-default" if args.default_only else "plan-trace"
    record(name, figures, args=args, documented=documented)


def against_dynamo(
    args: argparse.Namespace, folder: Path, ours: dict[str, float | str]
) -> dict[str, float | str]:
    """Dynamo's offline replay of the same trace, timed the same way, and the ratios."""
    why = dynamo_available(args.dynamo_python)
    if why is not None:
        print(f"dynamo: skipped ({args.dynamo_python} cannot import dynamo.replay.api: {why})")
        return {}
    argv = [args.dynamo_python, "-c", DYNAMO, str(folder / "trace.jsonl"),
            str(args.replicas), str(BLOCK)]  # fmt: skip
    timed(argv, folder)  # the warm-up, as for the plan
    runs = [timed(argv, folder) for _ in range(args.repeat)]
    figures: dict[str, float | str] = dict(show("dynamo", runs))
    for name in ("one_arm", "both_arms"):
        for kind in ("wall", "cpu"):
            ratio = float(figures[f"dynamo.{kind}_s"]) / float(ours[f"{name}.{kind}_s"])
            figures[f"ratio.{name}.{kind}"] = round(ratio, 2)
            print(f"Dynamo's {kind} / {name}'s: {ratio:.2f}x (above 1: the plan is faster)")
    return figures


if __name__ == "__main__":
    main()
