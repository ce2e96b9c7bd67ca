"""The run report: document model, figures, and ``RUN_DIR/report/``.

- :mod:`.document`: blocks rendered to Markdown and to one self-contained HTML file;
- :mod:`.plots`: the run's figures;
- :mod:`.routing`: the section on routers (runs with routed placements);
- :mod:`.reusesection`: the section on a trace's reuse (trace runs): what it allows,
  the working set against capacity, what the pool recovered;
- :mod:`.write`: :func:`write_report`, and the Problems and Limits it leads with
  (:func:`run_cautions`);
- :mod:`.notebook`: ``sessiongen notebook``, the analysis notebook executed on a run.
"""

from sessiongen.report.write import (
    SUMMARY_COLUMNS,
    read_cautions,
    report_cautions,
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
