"""Figures the docs quote, kept in data files beside the run that produced them.

A figure is never typed into prose by hand. ``python docs/figures.py RUN_DIR NAME --command
"..."`` reads a finished run folder (its manifest, ``report/decision.csv`` and
``report/summary.csv``) and writes ``docs/data/NAME.json``: the command, the run id, the
commit, the date, the machine, the load average when it was recorded, the wall time, and
every figure of the decision table and of the per-turn speedups, under keys such as
``alternate.session_gain`` or ``alternate.turn2.speedup``. With ``--picture`` it copies the
run's per-turn speedup plot to ``docs/assets/NAME-speedup.png`` too.

A docs page quotes a figure as ``{{ NAME:KEY:FORMAT }}`` (``{{ demo:alternate.session_gain:.2f }}``)
and the run's provenance as ``{{ NAME:@source }}``; the mkdocs hook in ``gen_reference.py``
fills them in, and an unknown name or key fails the build. A bench script run with the
settings the docs name writes its data file with ``write`` (through ``bench/_docs.py``: the
figures it prints), and only then. Figures of a run that cannot
be repeated in a docs build (the real pair, tens of minutes) were copied from the output
that run printed into a file that says so (``recorded_from``: where, at which commit), until
the bench's next run replaces it. A default or constant of the code is quoted from the code
itself, ``{{ code:sessiongen.capacity.fit.MAD_TO_SD:g }}``.
``tests/unit/test_docs_numbers.py`` fails on a figure typed into a page outside these.
The README, which GitHub shows as written, quotes figures in sentences that
``tests/unit/test_docs_figures.py`` rebuilds from the same data file, so a figure and its
source cannot disagree.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
ASSETS = HERE / "assets"
PLACEHOLDER = re.compile(r"\{\{ *([a-z0-9_-]+):([@A-Za-z0-9_.]+)(?::([^ }]*))? *\}\}")


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def read_run(run_dir: Path) -> dict[str, Any]:
    """The figures of a finished run, flat: ``PLACEMENT.COLUMN`` and ``PLACEMENT.turnN.speedup``."""
    figures: dict[str, Any] = {}
    with (run_dir / "report" / "decision.csv").open() as f:
        for row in csv.DictReader(f):
            for column, value in row.items():
                if column != "placement" and value != "":
                    figures[f"{row['placement']}.{column}"] = _number(value)
    with (run_dir / "report" / "summary.csv").open() as f:
        for row in csv.DictReader(f):
            if row["cache"] == "on" and row["speedup"]:
                for column in ("speedup", "speedup_ci_low", "speedup_ci_high"):
                    figures[f"{row['placement']}.turn{row['turn']}.{column}"] = float(row[column])
    return figures


def error_figures(run_dir: Path) -> dict[str, Any]:
    """A simulated run's measurement error over its cells (arm and turn), as shares of each
    cell's median TTFT (:func:`sessiongen.analysis.measurement_error`): the time scale, the
    cells, how many are flagged, the median and the worst cell; nothing for a real target.
    Imported here, not above: ``scripts/tier-times`` loads this file without sessiongen."""
    from sessiongen.analysis import measurement_error
    from sessiongen.records.run import load_run

    run = load_run(run_dir)
    error = measurement_error(run)
    if error.is_empty():
        return {}
    share = error["error_share"].abs()
    return {
        "time_scale": run.time_scale,
        "error.cells": error.height,
        "error.flagged": int(error["flagged"].sum()),
        "error.median_share": float(share.median()),
        "error.worst_share": float(share.max()),
    }


def record(
    run_dir: Path, name: str, command: str, *, picture: bool = False, wall_s: int | None = None
) -> Path:
    """Write ``docs/data/NAME.json`` from ``run_dir`` (and the picture, when asked).

    ``wall_s``: the command's own wall time, timed around it, where given (the manifest's
    start and end span the blocks only, not the start-up and the report after them)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    started = datetime.fromisoformat(manifest["started_at"])
    ended = datetime.fromisoformat(manifest["ended_at"])
    host = manifest["host"]
    data = {
        "command": command,
        "run_id": manifest["run_id"],
        "commit": manifest["tool"]["git_sha"],
        "date": started.date().isoformat(),
        "machine": f"{host['cpu_count']} cores, {host['machine']}, {host['platform']}",
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round((ended - started).total_seconds()) if wall_s is None else wall_s,
        "wall_timed": "around the command" if wall_s is not None else "manifest start to end",
        "uncommitted_changes": _uncommitted(),
        "figures": read_run(run_dir) | error_figures(run_dir),
    }
    DATA.mkdir(exist_ok=True)
    out = DATA / f"{name}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if picture:
        ASSETS.mkdir(exist_ok=True)
        shutil.copyfile(run_dir / "report" / "speedup.png", ASSETS / f"{name}-speedup.png")
    return out


def _uncommitted() -> int | None:
    """Files of the package and the scenarios that differ from the commit, when recorded
    (the run's code was the commit's only when this is 0; None outside a git checkout).
    Compared with HEAD through an index of its own, read from HEAD: the checkout's index
    may hold staged work that is not the commit's."""
    with tempfile.TemporaryDirectory() as tmp:
        env = os.environ | {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        changed: set[str] = set()
        for argv in (
            ["read-tree", "HEAD"],
            ["diff", "--name-only", "--", "sessiongen", "scenarios"],
            ["ls-files", "--others", "--exclude-standard", "--", "sessiongen", "scenarios"],
        ):
            done = subprocess.run(
                ["git", *argv], cwd=HERE.parent, env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                return None
            changed |= set(done.stdout.splitlines())
    return len(changed)


def write(name: str, *, command: str, figures: dict[str, Any]) -> Path:
    """Write ``docs/data/NAME.json`` for a bench script: its ``figures`` (flat keys, numbers
    or strings) stamped with the command, the commit, the date, the machine and the load
    average now. A file of figures recorded from an earlier run's output (``recorded_from``)
    is replaced whole by the bench's next run."""
    data: dict[str, Any] = {
        "command": command,
        "run_id": f"{name} {datetime.now():%Y-%m-%dT%H:%M}",
        "commit": _commit(),
        "date": datetime.now().date().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "uncommitted_changes": _uncommitted(),
        "figures": figures,
    }
    DATA.mkdir(exist_ok=True)
    out = DATA / f"{name}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return out


def _commit() -> str | None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=HERE.parent, capture_output=True, text=True, check=False
    )
    return head.stdout.strip() if head.returncode == 0 else None


def code_value(path: str) -> Any:
    """The value of a module-level name, ``sessiongen.pkg.module.NAME``, then of its
    attributes or keys (a function on the way is called with no arguments):
    what ``{{ code:PATH:FORMAT }}`` quotes, so a page states a default as the code has it."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if callable(value) and not isinstance(value, type):
                value = value()
            value = value[attr] if isinstance(value, dict) else getattr(value, attr)
        return value
    raise KeyError(f"{path}: no such module")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def source_line(data: dict[str, Any]) -> str:
    """Where a data file's figures come from, in one line."""
    if data.get("recorded_from"):
        return (
            f"`{data['command']}` on {data['date']} at commit "
            f"{(data['commit'] or 'unknown')[:10]}, "
            f"{data['machine']}, load average {data['load_average']}; recorded from "
            f"{data['recorded_from']}"
        )
    load1 = data["load_average_after"][0]
    return (
        f"`{data['command']}`, run {data['run_id']} of {data['date']} at commit "
        f"{(data['commit'] or 'unknown')[:10]}, {data['machine']}, "
        + (f"{data['wall_s']} s wall, " if "wall_s" in data else "")
        + f"load average {load1:g} when recorded"
        + (
            f", {data['uncommitted_changes']} files of the package not yet committed"
            if data.get("uncommitted_changes")
            else ""
        )
    )


def fill(markdown: str) -> str:
    """Replace every ``{{ NAME:KEY:FORMAT }}`` with its figure; unknown ones raise."""
    cache: dict[str, dict[str, Any]] = {}

    def one(match: re.Match[str]) -> str:
        name, key, spec = match.groups()
        if name == "code":
            return format(code_value(key), spec or "")
        if name not in cache:
            if not (DATA / f"{name}.json").exists():
                raise KeyError(f"{match.group(0)}: no docs/data/{name}.json")
            cache[name] = load(name)
        data = cache[name]
        if key == "@source":
            return source_line(data)
        if key.startswith("@"):
            return format(data[key[1:]], spec or "")
        if key not in data["figures"]:
            raise KeyError(f"{match.group(0)}: docs/data/{name}.json has no figure {key}")
        return format(data["figures"][key], spec or "")

    return PLACEHOLDER.sub(one, markdown)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("name")
    parser.add_argument("--command", required=True, help="the command that made the run")
    parser.add_argument("--picture", action="store_true", help="copy its speedup.png too")
    parser.add_argument("--wall-s", type=int, help="the command's wall time, timed around it")
    args = parser.parse_args()
    print(record(args.run_dir, args.name, args.command, picture=args.picture, wall_s=args.wall_s))
