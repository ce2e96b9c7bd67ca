"""Third-party modules imported when first used, not when the importing module loads.

``scipy.stats`` costs about half a second to import on a small machine, more than a
planned trace's engine spends on a block, and most commands that load the analysis
(``plan``, ``replay --dry-run``, the CLI's help) never call it. A module that needs it
writes::

    if TYPE_CHECKING:
        from scipy import stats as sps
    else:
        sps = lazy_module("scipy.stats")

so type checking sees the real module and the import happens on the first attribute
read. This is the standard library's own recipe (:class:`importlib.util.LazyLoader`);
the module is registered in ``sys.modules`` at once, so a later plain ``import`` of it
gets the same object. Python 3.11's lazy loading is not safe when two threads make the
first read at once; the analysis that reads these modules runs on one thread.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``'s module, loaded on its first attribute read (the one already imported,
    when it is)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
