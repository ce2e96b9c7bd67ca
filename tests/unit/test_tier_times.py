"""scripts/tier-times: what it prints of a times file, and the data file it records for
the docs (docs/data/test-times.json, quoted by the README and docs/getting-started.md)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "tier-times"
TIMES = "install\t105\t0\t0.50 1.20 2.00\ntest-fast\t576\t1\t5.10 4.00 3.00\n"


def _load(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def _run(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout


def test_it_prints_each_tier_and_the_total(tmp_path: Path) -> None:
    times = tmp_path / "times"
    times.write_text(TIMES)
    lines = _run(str(times)).splitlines()
    assert lines[0] == "tier times (wall clock):"
    assert lines[1].split() == "install 105 s 1.8 min exit 0 load average 0.50 1.20 2.00".split()
    assert lines[2].split()[:7] == ["test-fast", "576", "s", "9.6", "min", "exit", "1"]
    assert lines[3].split() == ["total", "681", "s", "11.3", "min"]


def test_nothing_recorded_is_said_so(tmp_path: Path) -> None:
    assert _run(str(tmp_path / "none"), env={}) == "tier times: none recorded\n"
    (tmp_path / "empty").write_text("")
    assert _run(str(tmp_path / "empty")) == "tier times: none recorded\n"


def test_a_malformed_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    times = tmp_path / "times"
    times.write_text(TIMES + "lint 12\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(times)], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert f"{times}: line 3: expected 4 tab-separated fields" in done.stderr


def test_recorded_times_are_what_the_docs_quote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiers = _load("tier_times_script", SCRIPT)
    figures = _load("docs_figures_for_tier_times", ROOT / "docs" / "figures.py")
    monkeypatch.setattr(figures, "DATA", tmp_path)
    times = tmp_path / "times"
    times.write_text(TIMES)
    rows = tiers.read_times(times)
    figures.write("test-times", command="make test", figures=tiers.figures_of(rows))
    data = figures.load("test-times")
    assert data["command"] == "make test" and data["load_average_after"]
    got = data["figures"]
    assert got["test_fast.wall_s"] == 576 and got["test_fast.min"] == 9.6
    assert got["test_fast.exit"] == 1 and got["install.load_average"] == "0.50 1.20 2.00"
    assert got["total.wall_s"] == 681 and got["total.min"] == 11.3
    text = figures.fill("fast tier {{ test-times:test_fast.min:.1f }} min")
    assert text == "fast tier 9.6 min"


def test_passed_counts_come_from_each_tiers_pytest_summary(tmp_path: Path) -> None:
    log = tmp_path / "make-test.log"
    log.write_text(
        "time: typecheck 18 s (exit 0, load average 2.06 1.99 3.37)\n"
        "2163 passed, 1 skipped in 584.65s (0:09:44)\n"
        "time: test-fast 587 s (exit 0, load average 3.77 3.68 3.73)\n"
        "time: real-stack 69 s (exit 0, load average 2.68 3.38 3.62)\n"
        "33 passed in 900.1s\n"
        "time: test-real 905 s (exit 0, load average 3.0 3.0 3.0)\n"
    )
    tiers = _load("tier_times_counts", SCRIPT)
    counts = tiers.passed_counts(log)
    assert counts == {"test_fast.passed": 2163, "test_real.passed": 33}
