"""Every path option of every command, given a path it cannot use, is one line naming
the path, exit status 2, no traceback: a missing file, a folder where a file is
expected, a file where a folder is, a folder that cannot be written, a run folder that
is not a run.

The options are found by walking the click command tree, so a new path option fails
:func:`test_every_path_option_has_a_role` until it is given a role here.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from sessiongen.cli import cli, main
from tests.support.arms import split_arm
from tests.support.paths import FIXTURES, ROOT
from tests.unit.capacity.test_fit import TRUTH, write_probe_run

SMOKE = ROOT / "scenarios" / "smoke.toml"
MANAGED = ROOT / "scenarios" / "smoke-cpu.toml"
RUN = sorted((FIXTURES / "v1" / "runs").iterdir())[-1]
STORE = FIXTURES / "v1" / "store"


def path_options() -> Iterator[tuple[str, str]]:
    """(command path, parameter name) of every click.Path parameter."""

    def walk(cmd: click.Command, prefix: str) -> Iterator[tuple[str, str]]:
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, f"{prefix} {name}".strip())
            return
        for param in cmd.params:
            if isinstance(param.type, click.Path) and param.name:
                yield prefix, param.name

    yield from walk(cli, "")


# What each path is: a TOML file read, a run folder read, a trend store or pair state
# read, a trace read, a file written, a folder written into.
TOML, RUN_IN, STORE_IN, STATE, TRACE_IN, FILE_OUT, DIR_OUT = (
    "toml", "run", "store", "state", "trace", "file-out", "dir-out",
)  # fmt: skip

ROLES: dict[tuple[str, str], str] = {
    ("generate", "scenario_file"): TOML,
    ("generate", "output"): FILE_OUT,
    ("export", "scenario_file"): TOML,
    ("export", "output"): FILE_OUT,
    ("trace-info", "trace_file"): TRACE_IN,
    ("replay", "scenario_file"): TOML,
    ("replay", "runs_dir"): DIR_OUT,
    ("report", "run_dirs"): RUN_IN,
    ("merge", "run_dirs"): RUN_IN,
    ("merge", "output"): DIR_OUT,
    ("notebook", "run_dir"): RUN_IN,
    ("notebook", "output"): FILE_OUT,
    ("compare", "store"): STORE_IN,
    ("pair up", "scenario_file"): TOML,
    ("pair up", "state_dir"): DIR_OUT,
    ("pair down", "state_dir"): STATE,
    ("pair status", "state_dir"): STATE,
    ("trend add", "run_dirs"): RUN_IN,
    ("trend add", "store"): DIR_OUT,
    ("trend check", "store"): STORE_IN,
    ("trend plot", "store"): STORE_IN,
    ("trend plot", "out"): DIR_OUT,
    ("nightly", "config"): TOML,
    ("nightly", "store"): DIR_OUT,
    ("nightly", "runs_dir"): DIR_OUT,
    ("fit", "run_dirs"): RUN_IN,
    ("fit", "output"): FILE_OUT,
    ("fit", "heldout"): RUN_IN,
    ("plan", "scenario_file"): TOML,
    ("plan", "profile"): TOML,
    ("plan", "runs_dir"): DIR_OUT,
    ("calibrate", "scenario_file"): TOML,
}


def command_line(command: str, param: str, value: Path, tmp: Path) -> list[str]:
    """A command line that would work, with ``value`` for ``param``."""
    v = str(value)

    def pick(name: str, default: Path | str) -> str:
        return v if name == param else str(default)

    if command == "generate":
        return ["generate", pick("scenario_file", SMOKE), "-o", pick("output", tmp / "o.jsonl")]
    if command == "export":
        return ["export", pick("scenario_file", SMOKE), "-o", pick("output", tmp / "t.jsonl")]
    if command == "trace-info":
        return ["trace-info", v]
    if command == "replay":
        return ["replay", pick("scenario_file", SMOKE), "--runs-dir", pick("runs_dir", tmp / "r"),
                "--no-progress", "--no-report"]  # fmt: skip
    if command == "report":
        return ["report", v]
    if command == "merge":
        if param == "run_dirs":
            return ["merge", v, str(RUN)]
        halves = [split_arm(RUN, arm, tmp / "halves") for arm in ("off", "on")]
        return ["merge", *map(str, halves), "-o", v]
    if command == "notebook":
        return ["notebook", pick("run_dir", RUN), "-o", pick("output", tmp / "nb.html")]
    if command == "compare":
        return ["compare", str(RUN), str(RUN), "--store", v]
    if command in ("pair up", "pair down", "pair status"):
        first = [pick("scenario_file", MANAGED)] if command == "pair up" else []
        return [*command.split(), *first, "--state-dir", pick("state_dir", tmp / "pair")]
    if command == "trend add":
        return ["trend", "add", pick("run_dirs", RUN), "--store", pick("store", tmp / "store")]
    if command == "trend check":
        return ["trend", "check", "--store", v]
    if command == "trend plot":
        return ["trend", "plot", "--store", pick("store", STORE), "--out", pick("out", tmp / "p")]
    if command == "nightly":
        config = pick("config", ROOT / "nightly" / "example.toml")
        store, runs = pick("store", tmp / "store"), pick("runs_dir", tmp / "r")
        return ["nightly", config, "--store", store, "--runs-dir", runs]
    if command == "fit":
        run = write_probe_run(tmp / "fit", TRUTH, noise=0.0, seed=0) if param != "run_dirs" else v
        heldout = ["--heldout", v] if param == "heldout" else []
        return ["fit", str(run), "-o", pick("output", tmp / "p.toml"),
                "--kv-bytes-per-token", "2048", *heldout]  # fmt: skip
    if command == "plan":
        profile = ["--profile", v] if param == "profile" else []
        return ["plan", pick("scenario_file", SMOKE), *profile,
                "--runs-dir", pick("runs_dir", tmp / "r"), "--no-progress"]  # fmt: skip
    if command == "calibrate":
        return ["calibrate", v]
    raise AssertionError(f"no command line for {command}: add one")


def locked(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``folder`` made unwritable (mode 0555). Root writes anyway, so for root the two
    calls every write here goes through (``os.open`` with O_CREAT, ``os.mkdir``) refuse
    in it as the kernel would refuse anyone else."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    if os.geteuid() == 0:
        real_open, real_mkdir = os.open, os.mkdir

        def refuse(path: Any) -> None:
            parent = Path(os.fsdecode(path)).absolute().parent
            if parent == folder.absolute():
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

        def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & os.O_CREAT:
                refuse(path)
            return real_open(path, flags, *args, **kwargs)

        def fake_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            refuse(path)
            real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "mkdir", fake_mkdir)
    return folder


@dataclass(frozen=True)
class Case:
    what: str
    make: Callable[[Path, pytest.MonkeyPatch], Path]
    says: str  # a regular expression


def _a_file(tmp: Path, _mp: pytest.MonkeyPatch) -> Path:
    (tmp / "a-file").write_text("")
    return tmp / "a-file"


def _empty_folder(tmp: Path, _mp: pytest.MonkeyPatch) -> Path:
    (tmp / "not-a-run").mkdir()
    return tmp / "not-a-run"


CASES: dict[str, list[Case]] = {
    TOML: [
        Case("missing", lambda t, _: t / "none.toml", "no such file"),
        Case("a folder", lambda t, _: _empty_folder(t, _), "is a directory"),
    ],
    RUN_IN: [
        Case("missing", lambda t, _: t / "no-run", "no manifest"),
        Case("a file", _a_file, "is a file"),
        Case(
            "a folder that is not a run", _empty_folder, r"no manifest \(is this a run folder\?\)"
        ),
    ],
    STORE_IN: [
        Case("missing", lambda t, _: t / "no-store", "no runs in the trend store"),
        Case("a file", _a_file, "is a file"),
        Case("a folder that is not a store", _empty_folder, "no runs in the trend store"),
    ],
    TRACE_IN: [
        Case("missing", lambda t, _: t / "none.jsonl", "no such file"),
        Case("a folder", lambda t, _: _empty_folder(t, _), "is a directory"),
        Case("empty", _a_file, "the trace is empty"),
    ],
    STATE: [
        Case("a file", _a_file, "is a file"),
        Case("under a file", lambda t, mp: _a_file(t, mp) / "pair", "unreadable pair state"),
    ],
    FILE_OUT: [
        Case("a folder", lambda t, _: _empty_folder(t, _), "is a directory"),
        Case("under a file", lambda t, mp: _a_file(t, mp) / "out", "is not a folder"),
        Case(
            "in an unwritable folder",
            lambda t, mp: locked(t / "ro", mp) / "out",
            "permission denied",
        ),
    ],
    DIR_OUT: [
        Case("a file", _a_file, "is a file"),
        Case("under a file", lambda t, mp: _a_file(t, mp) / "out", "is not a folder"),
        Case(
            "in an unwritable folder",
            lambda t, mp: locked(t / "ro", mp) / "out",
            "permission denied",
        ),
    ],
}

PARAMS = [
    pytest.param(command, param, case, id=f"{command} {param}: {case.what}")
    for command, param in path_options()
    for case in CASES.get(ROLES.get((command, param), ""), [])
]  # fmt: skip


def test_every_path_option_has_a_role() -> None:
    found = set(path_options())
    assert found - set(ROLES) == set(), "give each new path option a role in ROLES"
    assert set(ROLES) - found == set(), "ROLES names options that are gone"


@pytest.mark.parametrize(("command", "param", "case"), PARAMS)
def test_a_path_it_cannot_use_is_one_line_exit_2(
    command: str,
    param: str,
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing lands in the repository if a case runs through
    bad = case.make(tmp_path, monkeypatch)
    args = command_line(command, param, bad, tmp_path)
    runs_before = set(tmp_path.rglob("manifest.json"))
    with pytest.raises(SystemExit) as stop:
        main(args)
    # Refused before anything ran: no run folder was written.
    assert set(tmp_path.rglob("manifest.json")) == runs_before
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert stop.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("sessiongen: error: "), err
    assert "Traceback" not in err
    assert re.search(case.says, lines[0]), lines[0]
    # The path itself, or the part of it that is in the way (the file it runs under).
    assert str(bad) in lines[0] or str(bad.parent) in lines[0], lines[0]


@pytest.mark.parametrize("case", CASES[RUN_IN], ids=lambda c: c.what)
@pytest.mark.parametrize("side", ["a", "b", "among several"])
def test_compare_runs_it_cannot_read_are_one_line_exit_2(
    case: Case,
    side: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # RUN_A and RUN_B are plain arguments (one run, or several joined by commas).
    bad = str(case.make(tmp_path, monkeypatch))
    args = {
        "a": [bad, str(RUN)],
        "b": [str(RUN), bad],
        "among several": [f"{RUN},{bad}", str(RUN)],
    }[side]
    with pytest.raises(SystemExit) as stop:
        main(["compare", *args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(case.says, lines[0]) and bad in lines[0], lines[0]
