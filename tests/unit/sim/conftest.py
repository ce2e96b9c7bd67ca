"""What the sim tests share."""

from __future__ import annotations

import os

import pytest

from sessiongen.sim import compiled


@pytest.fixture
def compiled_engine() -> None:
    """The compiled engine is built and chosen: skip under ``SESSIONGEN_ENGINE=python``,
    fail when it should run and cannot load (saying why)."""
    if os.environ.get(compiled.ENV) == "python":
        pytest.skip("SESSIONGEN_ENGINE=python: the compiled engine was not chosen")
    if compiled.core() is None:
        pytest.fail(f"the compiled engine is {compiled._load()[1]}")
