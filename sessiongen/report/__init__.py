"""The run report: document model, figures, and ``RUN_DIR/report/``.

- :mod:`.document`: blocks rendered to Markdown and to one self-contained HTML file;
- :mod:`.plots`: the run's figures;
- :mod:`.routing`: the section on routers (runs with routed placements);
- :mod:`.reusesection`: the section on a trace's reuse (trace runs): what it allows,
  the working set against capacity, what the pool recovered;
- :mod:`.write`: :func:`write_report`: the report's sections in reading order
  (:func:`~.write.build_blocks`) and the files written; a run's Problems and Limits
  (:func:`run_cautions`);
- :mod:`.frames`: what the report shows, computed once, and how a section shows a frame;
- :mod:`.headline`: the answer: ``decision.csv`` and the per-turn speedup headline;
- :mod:`.problems`: the Limits, Problems and Notes the report leads with;
- :mod:`.cautions`: those Problems and Limits as data (``cautions.json``);
- :mod:`.details`: the per-arm and per-turn tables and a simulated run's measurement error;
- :mod:`.describe`: the header, the client's overhead, the method and the run's identity;
- :mod:`.notebook`: ``sessiongen notebook``, the analysis notebook executed on a run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessiongen.report.cautions import read_cautions, report_cautions
    from sessiongen.report.write import (
        SUMMARY_COLUMNS,
        run_cautions,
        summary_frame,
        write_report,
    )

__all__ = [
    "SUMMARY_COLUMNS",
    "read_cautions",
    "report_cautions",
    "run_cautions",
    "summary_frame",
    "write_report",
]

#: Where each export lives. Imported when first used (PEP 562), so a module of this
#: package (the planner's ``whatif``) does not import the run report's stack (its
#: figures, the client's overhead section, aiohttp): 1 s of a plan's start-up.
_HOMES = {
    "read_cautions": "cautions",
    "report_cautions": "cautions",
    "SUMMARY_COLUMNS": "write",
    "run_cautions": "write",
    "summary_frame": "write",
    "write_report": "write",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
