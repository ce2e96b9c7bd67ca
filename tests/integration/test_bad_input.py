"""Bad input of every kind is one line naming the file or field, exit status 2, and
nothing left half-written: sizes that cannot fit, paths that cannot be written, corrupt
run folders and trend stores, broken tokenizer files, usage mistakes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from sessiongen.cli import main
from tests.support.paths import FIXTURES, ROOT

SMOKE = str(ROOT / "scenarios" / "smoke.toml")
RUN = sorted((FIXTURES / "v1" / "runs").iterdir())[-1]


def invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI in this process: (exit status, what it wrote to stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    code = stop.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


Setup = Callable[[Path], list[str]]


def _file(tmp: Path) -> Path:
    path = tmp / "a-file"
    path.write_text("")
    return path


def _copy_run(tmp: Path) -> Path:
    return Path(shutil.copytree(RUN, tmp / "run"))


def _corrupt(tmp: Path, name: str, data: bytes) -> Path:
    run = _copy_run(tmp)
    (run / name).write_bytes(data)
    return run


CASES: dict[str, tuple[Setup, str]] = {
    "context too large for the schema": (
        lambda t: ["generate", SMOKE, "-o", str(t / "o.jsonl"),
                   "--set", "sessions.initial_context_tokens=99999999999"],
        "sessions.initial_context_tokens[0]: expected an integer >= 16 and <= 10000000",
    ),
    "sessions that cannot fit in memory": (
        lambda t: ["generate", SMOKE, "-o", str(t / "o.jsonl"), "--set",
                   "sessions.initial_context_tokens=9999999", "--set", "sessions.count=100000"],
        "sessions.initial_context_tokens: the sessions' texts would take about",
    ),
    "output under a file": (
        lambda t: ["generate", SMOKE, "-o", str(_file(t) / "x.jsonl")],
        "a-file: cannot write: exists and is not a folder",
    ),
    "output that is a folder": (
        lambda t: ["generate", SMOKE, "-o", str(t)],
        "is a directory",
    ),
    "runs folder under a file": (
        lambda t: ["replay", SMOKE, "--runs-dir", str(_file(t) / "runs"), "--no-progress"],
        "cannot write",
    ),
    "scenario that is a folder": (lambda t: ["replay", str(t)], "is a directory"),
    "scenario that is not TOML": (
        lambda t: ["replay", str(_write(t / "s.toml", "x = "))],
        "s.toml: not valid TOML",
    ),
    "tokenizer file that is not one": (
        lambda t: ["generate", SMOKE, "-o", str(t / "o.jsonl"), "--set",
                   f"model.tokenizer={_write(t / 'tok.json', 'nope')}"],
        "tok.json: not a tokenizer.json",
    ),
    "run folder with a broken manifest": (
        lambda t: ["report", str(_corrupt(t, "manifest.json", b"{oops"))],
        "manifest.json: unreadable manifest",
    ),
    "run folder with a broken requests.parquet": (
        lambda t: ["report", str(_corrupt(t, "requests.parquet", b"junk"))],
        "requests.parquet: unreadable",
    ),
    "run folder with a broken metrics.parquet": (
        lambda t: ["report", str(_corrupt(t, "metrics.parquet", b"junk"))],
        "metrics.parquet: unreadable",
    ),
    "report folder that is a file": (
        lambda t: ["report", str(_report_is_a_file(t))],
        "report: cannot write: exists and is not a folder",
    ),
    "compare against a broken run": (
        lambda t: ["compare", str(RUN), str(_corrupt(t, "requests.parquet", b"junk"))],
        "requests.parquet: unreadable",
    ),
    "trend store with a broken file": (
        lambda t: ["trend", "check", "--store", str(_broken_store(t))],
        "r.parquet: unreadable",
    ),
    "trend store with a file of another kind": (
        lambda t: ["trend", "check", "--store", str(_foreign_store(t))],
        "not a trend-store file",
    ),
    "trend plots under a file": (
        lambda t: ["trend", "plot", "--store", str(FIXTURES / "v1" / "store"),
                   "--out", str(_file(t) / "plots")],
        "cannot write",
    ),
    "nightly config missing": (
        lambda t: ["nightly", str(t / "none.toml"), "--store", str(t / "s")],
        "none.toml: no such file",
    ),
    "an endpoint given twice": (
        lambda t: ["replay", SMOKE, "--endpoints", "http://127.0.0.1:9,http://127.0.0.1:9",
                   "--cache", "on", "--runs-dir", str(t / "r")],
        "--endpoints: target.endpoints[1]: expected each entry once",
    ),
    "endpoints that name none": (
        lambda t: ["replay", SMOKE, "--endpoints", ",", "--cache", "on"],
        "--endpoints",
    ),
    "a varied value given twice": (
        lambda t: ["plan", SMOKE, "--vary", "target.sim.replicas=2,2", "--runs-dir", str(t)],
        "expected each value once",
    ),
    "unknown command": (lambda t: ["nosuch"], "No such command 'nosuch'"),
    "missing argument": (lambda t: ["replay"], "Missing argument 'SCENARIO_FILE'"),
}  # fmt: skip


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _report_is_a_file(tmp: Path) -> Path:
    run = _copy_run(tmp)
    (run / "report").write_text("")
    return run


def _broken_store(tmp: Path) -> Path:
    (tmp / "store" / "x").mkdir(parents=True)
    (tmp / "store" / "x" / "r.parquet").write_bytes(b"junk")
    return tmp / "store"


def _foreign_store(tmp: Path) -> Path:
    (tmp / "store" / "x").mkdir(parents=True)
    pl.DataFrame({"a": [1]}).write_parquet(tmp / "store" / "x" / "r.parquet")
    return tmp / "store"


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup, expected = CASES[case]
    before = set(tmp_path.rglob("*"))
    args = setup(tmp_path)
    made = set(tmp_path.rglob("*")) - before
    code, err = invoke(args, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sessiongen: error: "), err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err
    # Nothing half-written: no temp files, no new outputs beside what the case set up.
    left = {p for p in set(tmp_path.rglob("*")) - before - made if not p.is_dir()}
    assert not {p for p in left if p.name.endswith(".tmp")}, left
    assert not (tmp_path / "o.jsonl").exists()
