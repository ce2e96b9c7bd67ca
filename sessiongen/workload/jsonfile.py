"""What the trace and conversation readers share: opening an input file, reading it as
JSON lines, and quoting a bad value, each failure one line naming the file and place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

import orjson

from sessiongen.errors import ScenarioError


def show(value: object, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters, for an error message."""
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def open_input(path: Path, source: str, kind: str) -> IO[bytes]:
    """``path`` opened for reading bytes (the caller's ``with`` closes it); ``kind`` names
    what the file should be ("a trace file") where it is a folder."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise ScenarioError(source, "", "no such file") from None
    except IsADirectoryError:
        raise ScenarioError(source, "", f"is a folder, expected {kind}") from None
    except OSError as exc:
        raise ScenarioError(source, "", f"cannot read: {exc.strerror}") from None


def json_lines(fh: IO[bytes], source: str, hint: str = "") -> Iterator[tuple[int, object]]:
    """(line number, value) for each non-blank line; a line that is not JSON fails with
    the parser's message and ``hint`` after it."""
    for number, raw in enumerate(fh, start=1):
        if not raw.strip():
            continue
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ScenarioError(source, f"line {number}", f"not JSON: {exc.msg}{hint}") from None
        yield number, row
