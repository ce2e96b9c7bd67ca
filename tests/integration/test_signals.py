"""A real ``sessiongen replay``, signalled at chosen points of its life, leaves nothing.

Each case runs the smoke scenario (made small) on the embedded simulated pair as a
subprocess, waits for a point of its life (just started; a block's simulator starting;
a block serving requests; the report being written), waits a seeded fraction of a
second more, and sends SIGINT, SIGTERM, SIGHUP, two of them, or SIGKILL (one case
starts it as ``nohup`` would, SIGHUP ignored: the hangup must not stop it, the SIGTERM
after it must). Then every
process the replay caused, found from ``/proc`` by an environment tag they all inherit
(whatever their session, process group or parent now), must be gone within a generous
polled deadline; a replay that could clean up must have exited 128 + the signal, kept
what it measured and said in its manifest that the run is incomplete.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.support import descendants, signal_at
from tests.support.paths import ROOT, SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("stop_signals_answered")]

SEED = 19
TURNS = 2
SESSIONS = 2  # smoke.toml's
#: Small and short: two blocks (OFF, ON), two turns, the simulator at a quarter of real
#: time (its requests still take tens of milliseconds: a signal mid-block finds some in
#: flight).
OVERRIDES = (
    'design.blocks=["off","on"]',
    f"sessions.turns={TURNS}",
    "target.sim.time_scale=0.25",
)
#: Mid-block cases: every modeled latency 4x, so that the block signalled (about a second
#: of wall time then) is still serving when the signal lands after the seeded delay
#: (at 1x a busy machine's delay outlasted the block, which then ended "ok").
MID_BLOCK = ("target.sim.slowdown=4",)
#: Polled deadlines, for a slow and busy 2-core machine; none measures speed.
EVENT_DEADLINE_S = 180.0  # for the point of life a case waits for
EXIT_DEADLINE_S = 120.0  # for the replay to finish its clean-up and exit
GONE_DEADLINE_S = 30.0  # for every process it caused to be gone after it exited


@dataclass(frozen=True)
class Case:
    phase: str  # early | sim-start | mid-block | report
    signals: tuple[signal.Signals, ...]
    workers: int = 1
    block: int = 1  # sim-start and mid-block: in which block (1: after one was stopped)
    ignored: tuple[signal.Signals, ...] = ()  # ignored from the start, as nohup does

    @property
    def stopping(self) -> signal.Signals:
        """The first signal sent that the replay answers."""
        return next(s for s in self.signals if s not in self.ignored)

    @property
    def id(self) -> str:
        sigs = "+".join(s.name for s in self.signals)
        ignored = "".join(f"-{s.name}ignored" for s in self.ignored)
        return f"{self.phase}-{sigs}{ignored}" + (
            f"-workers{self.workers}" if self.workers > 1 else ""
        )


INT, TERM, HUP, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL
CASES = [
    Case("early", (TERM,)),
    Case("sim-start", (INT, TERM)),  # the one seen leaving a simulator behind
    Case("sim-start", (HUP,)),
    Case("mid-block", (INT, TERM)),
    Case("mid-block", (TERM,)),
    Case("mid-block", (HUP, TERM), ignored=(HUP,)),  # nohup: a closed terminal goes on
    Case("mid-block", (KILL,)),  # nothing can clean up: the children must notice
    Case("mid-block", (KILL,), workers=2, block=0),
    Case("report", (INT, INT)),
]


def _manifest(run_dir: Path | None) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    try:
        data: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):  # not written yet
        return None
    return data


def _run_dir(runs: Path) -> Path | None:
    found = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
    return found[0] if found else None


def _has_requests(log: Path) -> bool:
    try:
        return "prompt_tokens=" in log.read_text()
    except OSError:
        return False


def _workers_running(tag: str) -> bool:
    """True once a replay worker (a process of multiprocessing's spawn) carries ``tag``."""
    for pid in descendants.tagged(tag):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _reached(case: Case, block: int, runs: Path, tag: str) -> bool:
    """True once the replay is at the point of life ``case`` signals it in."""
    run_dir = _run_dir(runs)
    if run_dir is None:
        return False
    if case.phase == "sim-start":  # the log is opened just before the child starts
        return (run_dir / f"sim-{block}.log").exists()
    if case.phase == "mid-block":  # earlier blocks done, this one serving requests
        manifest = _manifest(run_dir) or {}
        blocks = manifest.get("blocks", [])
        done = len(blocks) > block and all(b["status"] == "ok" for b in blocks[:block])
        serving = done and _has_requests(run_dir / f"sim-{block}.log")
        return serving and (case.workers == 1 or _workers_running(tag))
    if case.phase == "report":
        return (run_dir / "report").exists()
    raise AssertionError(case.phase)


def _replay(runs: Path, tag: str, case: Case, out: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "sessiongen", "replay", str(SCENARIOS / "smoke.toml")]
    argv += ["--runs-dir", str(runs), "--no-progress", "--workers", str(case.workers)]
    argv += ["--report" if case.phase == "report" else "--no-report"]
    for override in OVERRIDES + (MID_BLOCK if case.phase == "mid-block" else ()):
        argv += ["--set", override]
    env = {**os.environ, descendants.TAG_VAR: tag, "PYTHONUNBUFFERED": "1"}
    env["PYTHONFAULTHANDLER"] = "1"  # a hung replay's stacks, when the test aborts it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))

    def ignore() -> None:
        for sig in case.ignored:
            signal.signal(sig, signal.SIG_IGN)

    with open(out, "wb") as sink:
        return subprocess.Popen(
            argv, env=env, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=ignore
        )


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[c.id for c in CASES])
def test_a_signalled_replay_leaves_no_process_behind(
    tmp_path: Path, index: int, case: Case
) -> None:
    rng = random.Random(f"{SEED}-{index}")
    block = case.block
    delay_s = rng.uniform(0.1, 1.5) if case.phase == "early" else rng.uniform(0.0, 0.6)
    gap_s = rng.uniform(0.02, 0.5)
    tag, runs, out = descendants.new_tag(), tmp_path / "runs", tmp_path / "out.txt"
    proc = _replay(runs, tag, case, out)
    try:
        if case.phase != "early":
            deadline = time.monotonic() + EVENT_DEADLINE_S
            while not _reached(case, block, runs, tag):
                assert proc.poll() is None, f"replay ended first:\n{out.read_text()}"
                assert time.monotonic() < deadline, f"never reached {case.phase}"
                time.sleep(0.02)
        time.sleep(delay_s)
        finished_first = proc.poll() is not None  # the report may be written already
        for i, sig in enumerate(case.signals):
            if i:
                time.sleep(gap_s)
            proc.send_signal(sig)
        try:
            code = proc.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            # Where it hangs: SIGABRT makes faulthandler (PYTHONFAULTHANDLER, _replay)
            # write every thread's stack to the output before the process dies.
            proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            pytest.fail(f"still running {EXIT_DEADLINE_S:g} s after the signal:\n{out.read_text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = descendants.survivors(tag, GONE_DEADLINE_S)
    descendants.kill(left)
    text = out.read_text()
    assert not left, f"left running:\n{descendants.describe(left)}\nreplay said:\n{text}"

    run_dir = _run_dir(runs)
    manifest = _manifest(run_dir)
    if case.signals[0] == KILL:
        assert code == -KILL
        return
    assert "Traceback" not in text, text
    first = case.stopping
    if finished_first:
        assert code == 0
    elif manifest is None:  # so early that the interpreter's defaults may still rule
        assert code in (128 + first, -first), text
    else:
        assert code == 128 + first, text
    if manifest is None or code == 0:
        return
    assert manifest["ended_at"] is not None  # the run folder was finalized
    if case.phase == "report":
        assert manifest["complete"] is True  # the run itself had finished
        return
    assert manifest["complete"] is False
    if case.phase == "mid-block":
        assert run_dir is not None
        statuses = [b["status"] for b in manifest["blocks"]]
        assert statuses[:block] == ["ok"] * block and statuses[block] == "interrupted"
        measured = pl.read_parquet(run_dir / "requests.parquet").filter(~pl.col("warmup"))
        assert measured.filter(pl.col("block") < block).height == block * SESSIONS * TURNS
        kept = re.search(r"interrupted: kept (\d+) measured requests", text)
        assert kept is not None and int(kept.group(1)) >= block * SESSIONS * TURNS


@pytest.mark.parametrize("point", list(signal_at.POINTS))
def test_a_sigterm_at_each_start_up_point_ends_as_a_sigterm(tmp_path: Path, point: str) -> None:
    """Deterministic, unlike the seeded delays above: the replay sends itself SIGTERM on
    entering each start-up point (tests/support/signal_at.py), from code run by exec."""
    tag, runs = descendants.new_tag(), tmp_path / "runs"
    argv = [sys.executable, "-m", "tests.support.signal_at", point, "replay"]
    argv += [str(SCENARIOS / "smoke.toml"), "--runs-dir", str(runs), "--no-progress"]
    argv += ["--no-report", *(a for o in OVERRIDES for a in ("--set", o))]
    env = {**os.environ, descendants.TAG_VAR: tag}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=EXIT_DEADLINE_S
    )
    left = descendants.survivors(tag, GONE_DEADLINE_S)
    descendants.kill(left)
    said = done.stdout + done.stderr
    assert not left, f"left running:\n{descendants.describe(left)}\nreplay said:\n{said}"
    assert "Traceback" not in said, said
    before = point == "before-handlers"  # the interpreter's default: death by SIGTERM
    assert done.returncode == (-TERM if before else 128 + TERM), said
    manifest = _manifest(_run_dir(runs))
    if manifest is not None:
        assert manifest["complete"] is False and manifest["ended_at"] is not None
