"""Atomic writes: a temp file in the same folder, flushed, then renamed into place.

A reader (a report, a nightly job, a teammate's notebook) never sees half a file, and a
crash leaves the previous version. ``tempfile.mkstemp`` creates files readable by their
owner only (mode 0600, whatever the umask), which would make results unreadable to a web
server or another user; every file written here gets the mode a plain ``open()`` would
have given it (0666 minus the process umask) before it is renamed into place.

Paths that cannot be written (no such folder, a file where a folder should be, no
permission, a full disk, a read-only file system) raise :class:`~sessiongen.errors.OutputError`,
one line naming the path; the temp file is removed and the old file left as it was.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from sessiongen.errors import OutputError

_USER_FIXABLE = {
    errno.ENOENT: "no such folder",
    errno.ENOTDIR: "a path component is not a folder",
    errno.EISDIR: "is a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.ENAMETOOLONG: "name too long",
    errno.EEXIST: "already exists",
}


def umask() -> int:
    """The process umask, read without changing it (Linux ``/proc``; else set and reset)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: 0666 minus the umask."""
    return 0o666 & ~umask()


def output_error(path: Path, exc: OSError) -> OutputError:
    """A one-line :class:`OutputError` for an ``OSError`` met while writing ``path``."""
    why = _USER_FIXABLE.get(exc.errno or 0) or exc.strerror or type(exc).__name__
    return OutputError(f"{path}: cannot write: {why}")


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed; an :class:`OutputError` if it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{path}: cannot write: exists and is not a folder") from None
    except OSError as exc:
        raise output_error(path, exc) from None
    return path


def check_writable(path: Path) -> Path:
    """Fail now, with the one-line :class:`OutputError` a write would give, when ``path``
    cannot be written (its folder is created): for outputs that come after long work."""
    path = Path(path)
    ensure_dir(path.parent)
    if path.is_dir():
        raise OutputError(f"{path}: cannot write: is a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise output_error(path, exc) from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Create ``path`` atomically with ``write(fh)`` filling a temp file opened for bytes."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise output_error(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON with sorted keys (stable diffs), atomically."""
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    atomic_write_bytes(path, text)
