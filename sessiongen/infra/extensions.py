"""The project's optional compiled modules (Cython, built by ``pip install``): loaded only
when they are as new as their source, and chosen one way for all of them.

An editable checkout whose ``.pyx`` changed since the last ``pip install -e .`` would
otherwise run an older build silently; the caller runs its pure-Python twin instead and
says why once. ``SESSIONGEN_ENGINE=python`` (or ``compiled``) forces one choice for every
compiled module (the planner's engine, the chain hash, a trace's reuse walk); ``auto``, the
default, takes each compiled module that is built and fresh.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Literal

from sessiongen.errors import MissingDependencyError, UserError

Engine = Literal["auto", "python", "compiled"]

#: The environment variable that forces an engine.
ENV = "SESSIONGEN_ENGINE"

ENGINES: tuple[Engine, ...] = ("auto", "python", "compiled")


def load_fresh(name: str) -> tuple[ModuleType | None, str]:
    """(the compiled module ``name``, "") or (None, why it is not usable)."""
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        return None, f"not built ({exc})"
    built = Path(module.__file__ or "")
    # its .pyx and the shared Python sources it includes (a module's SOURCES names them)
    names = getattr(module, "SOURCES", (name.rpartition(".")[2] + ".pyx",))
    for source in (built.with_name(n) for n in names):
        if source.exists() and source.stat().st_mtime > built.stat().st_mtime:
            return None, f"{built.name} is older than {source.name}: run pip install -e . again"
    return module, ""


def requested(engine: Engine = "auto") -> Engine:
    """``engine``, or the environment's choice when ``auto`` (a one-line error for a
    value that is not an engine)."""
    if engine != "auto":
        return engine
    forced = os.environ.get(ENV) or "auto"
    for choice in ENGINES:
        if forced == choice:
            return choice
    raise UserError(f"{ENV}={forced}: expected one of {', '.join(ENGINES)}")


def choose(engine: Engine, loaded: tuple[ModuleType | None, str], what: str) -> ModuleType | None:
    """The compiled module to run, or None for the Python twin: ``engine`` as
    :func:`requested` reads it, ``loaded`` what :func:`load_fresh` gave, ``what`` its name
    in messages. Raises MissingDependencyError when ``compiled`` is asked for and the
    module is not usable; a stale build warns once."""
    chosen = requested(engine)
    if chosen == "python":
        return None
    module, why = loaded
    if module is None:
        if chosen == "compiled":
            raise MissingDependencyError(f"{what} is {why}")
        _warn_once(what, why)
    return module


@functools.cache
def _warn_once(what: str, why: str) -> None:
    if "older than" in why:
        warnings.warn(f"running Python instead: {what} {why}", stacklevel=4)
