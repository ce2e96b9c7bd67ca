"""Per-stage timing (``plan --verbose``): stages add up, nothing is timed unless asked,
a block's progress is its stage, and the plan names its stages."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiongen.cli import main
from sessiongen.infra.progress import BlockProgress
from sessiongen.infra.stages import TIMER, StageTimer
from tests.support.paths import ROOT


@pytest.fixture(autouse=True)
def _timer_off() -> Iterator[None]:
    yield
    TIMER.enabled = False


def test_a_timer_off_records_nothing() -> None:
    timer = StageTimer()
    with timer.stage("a"):
        pass
    timer.add("b", wall_s=1.0, cpu_s=1.0)
    assert timer.times() == []


def test_stages_add_up_in_the_order_first_entered() -> None:
    timer = StageTimer()
    timer.start()
    for _ in range(2):
        with timer.stage("spin"):
            end = time.process_time() + 0.02
            while time.process_time() < end:
                pass
    timer.add("given", wall_s=1.5, cpu_s=0.5)
    spin, given = timer.times()
    assert (spin.name, spin.count, given.name, given.count) == ("spin", 2, "given", 1)
    assert spin.cpu_s >= 0.04 and spin.wall_s >= spin.cpu_s * 0.5
    assert timer.lines()[0].startswith("stage spin: ") and timer.lines()[0].endswith("(2x)")
    assert timer.lines()[1] == "stage given: 1.500 s wall, 0.500 s CPU"
    timer.start(since_process_start="start-up")
    (startup,) = timer.times()
    assert startup.name == "start-up" and startup.cpu_s > 0 and startup.wall_s > 0


def test_a_block_is_timed_from_its_progress() -> None:
    TIMER.start()
    bar = BlockProgress(3, "[1] fixed cache=on", enabled=False, time_scale=1.0, unit="s")
    bar.close()
    bar.close()  # idempotent: counted once
    (block,) = TIMER.times()
    assert (block.name, block.count) == ("block [1] fixed cache=on", 1)


def test_plan_verbose_prints_its_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main([
        "plan", str(ROOT / "scenarios" / "smoke.toml"), "--no-progress", "--seeds", "1",
        "--no-sensitivity", "--verbose", "--runs-dir", str(tmp_path),
        "--set", "driver.concurrency=1", "--set", 'design.blocks=["off", "on"]',
    ])  # fmt: skip
    err = capsys.readouterr().err
    stages = [line.split(":")[0] for line in err.splitlines() if line.startswith("stage ")]
    assert stages[0] == "stage start-up (interpreter, imports, options)"
    for name in (
        "block [1]",
        "decision",
        "report and figures",
        "configurations planned",
        "simulated pair set up",
        "sessions and prompts set up",
        "records framed",
    ):
        assert any(s.startswith(f"stage {name}") for s in stages), (name, stages)


def test_a_plan_with_its_decision_never_imports_scipy_stats(tmp_path: Path) -> None:
    """The plan's quantiles come from scipy.special (analysis/stats.py, hypotheses.py,
    tails.py): scipy.stats, three times its import time, is never loaded; nor is what
    only the served simulator and the terminal use (asyncio, prometheus_client, urllib's
    HTTP client, tqdm with --no-progress)."""
    code = (
        "import sys; from sessiongen.cli import main\n"
        "try:\n"
        f"    main(['plan', {str(ROOT / 'scenarios' / 'smoke.toml')!r}, '--no-progress',"
        f" '--seeds', '1', '--no-sensitivity', '--runs-dir', {str(tmp_path)!r},"
        " '--set', 'design.blocks=[\"off\", \"on\"]'])\n"
        "except SystemExit:\n    pass\n"
        "print('LOADED', 'scipy.stats._stats_py' in sys.modules,"
        " 'scipy.special._ufuncs' in sys.modules,"
        " sorted(m for m in ('asyncio', 'prometheus_client', 'urllib.request', 'tqdm')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the decision ran (scipy.special read) and scipy.stats did not load, nor the rest
    assert out.stdout.splitlines()[-1] == "LOADED False True []", out.stdout[-2000:] + out.stderr


def test_the_planner_imports_no_figures_nor_client() -> None:
    """A plan's start-up: matplotlib only where a figure is drawn, the served client's
    aiohttp never (the run report's stack is imported where it is used), scipy's
    statistics only where a function first reads them (infra/lazy.py)."""
    loaded = ("matplotlib", "aiohttp", "scipy.stats._stats_py", "scipy.special._ufuncs")
    code = (
        "import sys; import sessiongen.cli; import sessiongen.capacity.plan; "
        f"print(sorted(m for m in {loaded!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
