"""When the cyclic garbage collector runs, for work that makes many objects and no cycles.

The planner makes hundreds of thousands of small objects (a trace's requests, turns and
sessions; a block's engine requests and rows) that reference counting frees, and no
cycles that outlive a block. The collector's passes over them find nothing: a one-arm
plan of the 12,031-request bench trace spent 0.14 s of its 1.6 s in them (``gc.callbacks``),
two full passes of 22 and 36 ms over every object the imports had made among them.

- :func:`frozen_heap`: what exists when it starts (the modules, their classes and
  functions, the scenario) is left out of every pass until it ends (:func:`gc.freeze`);
- :func:`no_collections`: no passes at all while it lasts; what cycles are left are
  collected after (a block: at a threshold of 100,000 allocations the passes still took
  12% of a planned hour's CPU, walking the live sessions' objects).

The command line also freezes the heap as the process exits (:func:`sessiongen.cli.main`):
the interpreter's last pass would walk everything only to free it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects that exist now are not scanned until this ends (then they are again)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """The collector off while this lasts, as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
