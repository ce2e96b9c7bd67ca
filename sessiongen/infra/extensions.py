"""The project's optional compiled modules (Cython, built by ``pip install``), loaded
only when they are as new as their source.

An editable checkout whose ``.pyx`` changed since the last ``pip install -e .`` would
otherwise run an older build silently; the caller runs its pure-Python twin instead and
can say why (the reason returned here).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType


def load_fresh(name: str) -> tuple[ModuleType | None, str]:
    """(the compiled module ``name``, "") or (None, why it is not usable)."""
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        return None, f"not built ({exc})"
    built = Path(module.__file__ or "")
    source = built.with_name(name.rpartition(".")[2] + ".pyx")
    if source.exists() and source.stat().st_mtime > built.stat().st_mtime:
        return None, f"{built.name} is older than {source.name}: run pip install -e . again"
    return module, ""
