"""The repository's tracked text has no leftover merge conflict markers."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.paths import ROOT

MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "*.py", "*.md", "*.toml", "*.ipynb", "*.cfg", "*.txt", "*.yml"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [line for line in out.splitlines() if line]


def test_no_conflict_markers() -> None:
    found = [
        name for name in tracked_text_files()
        if (ROOT / name).is_file() and MARKER.search((ROOT / name).read_text(errors="replace"))
    ]  # fmt: skip
    assert found == []
