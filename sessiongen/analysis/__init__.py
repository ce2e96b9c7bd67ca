"""Analysis of recorded runs with polars: the one door for the CLI, notebook and nightly job.

- :mod:`.stats`: pure, seeded statistics (bootstrap intervals, rank tests);
- :mod:`.frames`: small helpers to build frames from a run's requests;
- :mod:`.latency`: per-turn medians, ON/OFF speedups, sessions;
- :mod:`.drift`: block drift per arm and turn, against each turn's effect;
- :mod:`.checks`: contamination, attribution, needle grades, equivalence;
- :mod:`.adequacy`: warnings when a run is too small for its statistics;
- :mod:`.summary`: one row per cell, the headline metrics (``summary.csv``, the trend);
- :mod:`.compare`: one run against another.

Runs are loaded with :func:`load_run` (:mod:`sessiongen.records.run`); every duration is
in modeled seconds (measured / time scale).
"""

from sessiongen.analysis.adequacy import interval_warnings
from sessiongen.analysis.checks import (
    LOGPROB_TOL,
    Equivalence,
    cache_attribution,
    contamination,
    contamination_expr,
    divergence_counts,
    divergences,
    equivalence,
    needle_grades,
)
from sessiongen.analysis.compare import EXIT_CODES, Comparison, compare_runs
from sessiongen.analysis.drift import (
    DRIFT_MIN,
    DRIFT_MIN_UNITS,
    block_drift,
    drift_units,
    drift_verdict,
)
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.latency import (
    arm_turn_table,
    cold_first_turns,
    console_table,
    cross_vs_same,
    paired_design,
    session_speedup,
    session_totals,
    speedup_table,
)
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.analysis.summary import run_summary
from sessiongen.records.run import Run, latest_run, load_run, resolve_run_dir

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DRIFT_MIN",
    "DRIFT_MIN_UNITS",
    "EXIT_CODES",
    "LOGPROB_TOL",
    "Bootstrap",
    "Comparison",
    "Equivalence",
    "Run",
    "arm_turn_table",
    "block_drift",
    "cache_attribution",
    "cold_first_turns",
    "compare_runs",
    "console_table",
    "contamination",
    "contamination_expr",
    "cross_vs_same",
    "divergence_counts",
    "divergences",
    "drift_units",
    "drift_verdict",
    "drop_single_context",
    "equivalence",
    "interval_warnings",
    "latest_run",
    "load_run",
    "needle_grades",
    "paired_design",
    "resolve_run_dir",
    "run_summary",
    "session_speedup",
    "session_totals",
    "speedup_table",
]
