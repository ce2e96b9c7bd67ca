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
