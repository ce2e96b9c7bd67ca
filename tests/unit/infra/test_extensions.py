"""infra.extensions: a compiled module is used only when it is as new as its source."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sessiongen.infra.extensions import load_fresh


def test_missing_built_and_stale_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    module, why = load_fresh("no_such_extension_here")
    assert module is None and why.startswith("not built")
    built = tmp_path / "ext_fresh_probe.py"  # stands in for the .so: any importable file
    built.write_text("VALUE = 1\n")
    source = tmp_path / "ext_fresh_probe.pyx"
    source.write_text("# the source\n")
    os.utime(source, (1_000, 1_000))
    module, why = load_fresh("ext_fresh_probe")
    assert module is not None and module.VALUE == 1 and why == ""
    os.utime(source, (built.stat().st_mtime + 10,) * 2)  # edited after the build
    sys.modules.pop("ext_fresh_probe")
    module, why = load_fresh("ext_fresh_probe")
    assert module is None
    assert why == "ext_fresh_probe.py is older than ext_fresh_probe.pyx: run pip install -e . again"


def test_a_module_is_stale_when_a_source_it_includes_is_newer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    built = tmp_path / "ext_shared_probe.py"  # stands in for the .so
    built.write_text('SOURCES = ("ext_shared_probe.pyx", "shared_terms.py")\n')
    for name in ("ext_shared_probe.pyx", "shared_terms.py"):
        (tmp_path / name).write_text("# a source\n")
        os.utime(tmp_path / name, (1_000, 1_000))
    module, why = load_fresh("ext_shared_probe")
    assert module is not None and why == ""
    os.utime(tmp_path / "shared_terms.py", (built.stat().st_mtime + 10,) * 2)
    sys.modules.pop("ext_shared_probe")
    module, why = load_fresh("ext_shared_probe")
    assert module is None
    assert why == "ext_shared_probe.py is older than shared_terms.py: run pip install -e . again"
