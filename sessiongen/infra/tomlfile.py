"""TOML files read with one-line errors that name the file (scenarios, nightly configs,
profiles)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from sessiongen.errors import ScenarioError


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed file; a :class:`ScenarioError` naming it when missing or not TOML."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, "", "no such file") from None
    except IsADirectoryError:
        raise ScenarioError(source, "", "is a folder, expected a TOML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(source, "", f"cannot read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, "", f"not valid TOML: {exc}") from None
