"""Where a bench's figures go: ``docs/data/NAME.json``, the file the docs quote them from.

A bench run with its documented settings (the defaults of its parser) writes its figures
through ``docs/figures.py``'s ``write`` (stamped with the command, commit, date, machine and
load average), replacing a file recorded from an earlier run's printed output; a run with
other settings only prints, so a quick look never replaces the documented figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def record(
    name: str, figures: dict[str, Any], *, args: argparse.Namespace, documented: argparse.Namespace
) -> None:
    """Write ``figures`` to ``docs/data/NAME.json`` when ``args`` are the ``documented`` ones."""
    if args != documented:
        print(f"(figures not recorded: docs/data/{name}.json holds the documented settings' run)")
        return
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    script = Path(sys.argv[0]).resolve().relative_to(ROOT).as_posix()
    command = shlex.join(["python", script, *sys.argv[1:]])
    path = module.write(name, command=command, figures=figures)
    print(f"figures written to {path.relative_to(ROOT)}")
