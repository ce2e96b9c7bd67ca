"""Which engine runs, on the virtual clock and in the served simulator alike: the compiled
one where it was built, else Python.

The compiled engine (``sessiongen/sim/_core.pyx``, built by ``pip install``) is the same
engine as :mod:`.cluster` and :mod:`.scheduler`, ported decision by decision; it exists
because a planned day is millions of engine steps, each a few dozen attribute reads and
branches that the interpreter makes 10-20x slower, and a served trace's rate is bound by
the one core its event loop runs on. Results are identical
(``tests/unit/sim/test_engines.py``, ``tests/unit/sim/test_served_engines.py``), so the
choice is speed only.

``SESSIONGEN_ENGINE=python`` (or ``compiled``) forces one; ``auto`` (the default) takes the
compiled engine when it imports and is not older than its source file (an editable
checkout whose ``_core.pyx`` changed since the last ``pip install -e .`` runs Python and
says why once, rather than silently running an older engine).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

from sessiongen.infra.extensions import ENGINES, ENV, Engine, choose, load_fresh, requested

# the engine choice's names, where the simulator and its callers have always read them
__all__ = ["ENGINES", "ENV", "Engine", "core", "hash_kernel", "kernel", "resolve"]


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    """(the compiled module or None, why not)."""
    return load_fresh("sessiongen.sim._core")


def core() -> ModuleType | None:
    """The compiled engine's module, None where it is not usable."""
    return _load()[0]


def resolve(engine: Engine = "auto") -> Literal["python", "compiled"]:
    """The engine to run: ``engine``, or the environment's choice when ``auto``.

    Raises MissingDependencyError when the compiled engine is asked for and not usable.
    """
    module = choose(engine, _load(), "the compiled engine")
    return "python" if module is None else "compiled"


def hash_kernel() -> Callable[..., Any] | None:
    """The compiled chain hash (:func:`sessiongen.sim.cache.KeyChain` hashes with numpy
    without it), when the compiled engine is the one chosen."""
    return kernel("chain_hash")


def kernel(name: str) -> Callable[..., Any] | None:
    """The compiled module's function ``name`` when the compiled engine is the one chosen,
    else None (its caller then runs its numpy twin). The environment is read at every
    call, by the rule every compiled module follows (:func:`requested`); the choice it
    makes is cached."""
    return _kernel_for(requested(), name)


@functools.cache
def _kernel_for(setting: Engine, name: str) -> Callable[..., Any] | None:
    module = core()
    if module is None or setting == "python":
        return None
    function: Callable[..., Any] = getattr(module, name)
    return function
