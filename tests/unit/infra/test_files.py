"""Atomic writes: results get the mode the umask implies, and bad paths are one line."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from sessiongen.errors import OutputError
from sessiongen.infra import files
from sessiongen.records.io import atomic_write_parquet


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_take_the_mode_the_umask_implies(
    tmp_path: Path, umask: None, mask: int, expected: int
) -> None:
    os.umask(mask)
    assert files.umask() == mask
    files.atomic_write_bytes(tmp_path / "a.bin", b"x")
    files.atomic_write_json(tmp_path / "b.json", {"k": 1})
    atomic_write_parquet(tmp_path / "c.parquet", pl.DataFrame({"x": [1]}))
    for name in ("a.bin", "b.json", "c.parquet"):
        assert mode(tmp_path / name) == expected, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.json", "c.parquet"]


def test_a_path_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"nope/x\.json: cannot write: no such folder"):
        files.atomic_write_json(tmp_path / "nope" / "x.json", {})
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="not a folder"):
        files.ensure_dir(blocker / "sub")
    with pytest.raises(OutputError, match="not a folder"):
        files.atomic_write_bytes(blocker / "x", b"")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_no_permission_is_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutputError, match="permission denied"):
        files.atomic_write_bytes(locked / "x", b"")


def test_an_old_file_survives_a_failed_write(tmp_path: Path) -> None:
    path = tmp_path / "keep.json"
    files.atomic_write_json(path, {"v": 1})

    def broken(fh: object) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="no space left"):
        files.atomic_write(path, broken)  # type: ignore[arg-type]
    assert path.read_text().strip().endswith("}") and '"v": 1' in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["keep.json"]
