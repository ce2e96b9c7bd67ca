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

scipy's array-API layer copies numpy's namespace while it imports, reading every
public name, and so imports numpy's :data:`NUMPY_EXTRAS` too: ``numpy.f2py`` alone cost
63 ms (its Fortran reader compiles regular expressions at import), two thirds of a plan's
``scipy.special``. No scipy function the analysis calls uses them, so before a scipy
module is deferred they are deferred the same way (:func:`defer_numpy_extras`): they
load if and when anything reads them, as before.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

#: numpy's submodules that scipy's import reads and the analysis never needs (module doc):
#: the two that cost most, and that no library the tool runs reads on a second thread
#: (matplotlib reads numpy.ma, so that one stays eager).
NUMPY_EXTRAS = ("f2py", "testing")


def lazy_module(name: str) -> ModuleType:
    """``name``'s module, loaded on its first attribute read (the one already imported,
    when it is)."""
    if name in sys.modules:
        return sys.modules[name]
    if name.partition(".")[0] == "scipy":
        defer_numpy_extras()
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def defer_numpy_extras() -> None:
    """:data:`NUMPY_EXTRAS` not yet imported, made lazy (module doc). Each is set as
    numpy's attribute as well: numpy's own ``__getattr__`` would import it again."""
    import numpy

    for name in NUMPY_EXTRAS:
        full = f"numpy.{name}"
        if full not in sys.modules and importlib.util.find_spec(full) is not None:
            setattr(numpy, name, lazy_module(full))
