"""Analysis of recorded runs with polars: the one door for the CLI, notebook and nightly job.

- :mod:`.stats`: pure, seeded statistics (bootstrap intervals, rank tests);
- :mod:`.hypotheses`: tests and one-sided bounds on log ratios, means, shares and rates;
- :mod:`.frames`: small helpers to build frames from a run's requests;
- :mod:`.latency`: per-turn medians, ON/OFF speedups, sessions;
- :mod:`.drift`: block drift per arm and turn, against each turn's effect;
- :mod:`.checks`: contamination, attribution, needle grades;
- :mod:`.arms`: is each block in the cache arm it is labeled with (counters, not labels);
- :mod:`.prompts`: which requests sent the same prompt, which the shared pool served;
- :mod:`.correctness`: answers judged against the OFF arm on the same prompt, verdicts;
- :mod:`.verdicts`: a run's correctness per probe (report, trend, ``replay`` exit status);
- :mod:`.adequacy`: warnings when a run is too small for its statistics;
- :mod:`.fidelity`: can the run be read as the cache's effect: measurement error of
  simulated runs, late arrivals on the modeled clock, cold first turns that differ between arms;
- :mod:`.tails`: tail percentiles with MLPerf LoadGen's early-stopping estimate;
- :mod:`.load`: saturation, goodput, sustained load, working set, reuse distance;
- :mod:`.reuse`: a replayed trace's reuse: what an infinite cache could serve (anywhere,
  per replica as placed), LRU reuse distances, the working set in blocks, and how much
  of it each arm's local cache and pool got;
- :mod:`.summary`: one row per cell, the headline metrics (``summary.csv``, the trend);
- :mod:`.routing`: routers in the loop: sessions moved, replicas known, the pool's gain;
- :mod:`.compare`: runs against runs (run-to-run noise, Holm over cells, failures);
  its cells' data and resampling in :mod:`.comparecells`, their tests and decisions in
  :mod:`.comparetests`, the run-to-run noise (given, replicates, assumed; per cell) in
  :mod:`.runnoise`;
- :mod:`.payoff`: does the pool pay: a run reduced to what-if rows and their verdicts, one
  reading for a plan and a replay;
- :mod:`.whatif`: the what-if table's columns and what they mean, ``--vary`` options and
  configurations (the planner writes them, the report prints them);
- :mod:`.structure`: the pair's structure a run records (KV block and cache, scheduler
  limits, LMCache chunk and pool), for the fit and the reuse report.

Runs are loaded with :func:`load_run` (:mod:`sessiongen.records.run`); every duration is
in modeled seconds (measured / time scale).
"""

from sessiongen.analysis.adequacy import (
    coverage_note,
    fewest_sessions,
    interval_warnings,
    p90_coverage_note,
)
from sessiongen.analysis.arms import arm_check, mislabeled_arms
from sessiongen.analysis.checks import (
    cache_attribution,
    contamination,
    contamination_expr,
    needle_grades,
)
from sessiongen.analysis.compare import EXIT_CODES, Comparison, compare_runs
from sessiongen.analysis.correctness import LOGPROB_TOL, VERDICTS
from sessiongen.analysis.drift import (
    DRIFT_MIN,
    DRIFT_MIN_UNITS,
    block_drift,
    drift_units,
    drift_verdict,
)
from sessiongen.analysis.fidelity import (
    COLD_TOLERANCE,
    ERROR_SHARE,
    STORE_COST_TOLERANCE,
    cold_check_limit,
    cold_turn_asymmetry,
    lag_effect,
    late_arrival_warning,
    late_arrivals,
    measurement_error,
    time_scale_remedy,
    trust_warnings,
)
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.latency import (
    SESSION_GAIN,
    arm_turn_table,
    cold_first_turns,
    console_table,
    cross_vs_same,
    paired_design,
    session_speedup,
    session_totals,
    speedup_table,
)
from sessiongen.analysis.routing import (
    console_routing,
    has_routed,
    replica_moves,
    routing_headline,
)
from sessiongen.analysis.runnoise import DEFAULT_RUN_NOISE, RunNoise
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.analysis.summary import run_summary
from sessiongen.analysis.verdicts import (
    Correctness,
    Equivalence,
    Needles,
    correctness,
    correctness_cells,
    divergence_counts,
    divergences,
    equivalence,
)
from sessiongen.records.run import Run, latest_run, load_run, resolve_run_dir

__all__ = [
    "COLD_TOLERANCE",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_RUN_NOISE",
    "DRIFT_MIN",
    "DRIFT_MIN_UNITS",
    "ERROR_SHARE",
    "EXIT_CODES",
    "LOGPROB_TOL",
    "SESSION_GAIN",
    "STORE_COST_TOLERANCE",
    "VERDICTS",
    "Bootstrap",
    "Comparison",
    "Correctness",
    "Equivalence",
    "Needles",
    "Run",
    "RunNoise",
    "arm_check",
    "arm_turn_table",
    "block_drift",
    "cache_attribution",
    "cold_check_limit",
    "cold_first_turns",
    "cold_turn_asymmetry",
    "compare_runs",
    "console_routing",
    "console_table",
    "contamination",
    "contamination_expr",
    "correctness",
    "correctness_cells",
    "coverage_note",
    "cross_vs_same",
    "divergence_counts",
    "divergences",
    "drift_units",
    "drift_verdict",
    "drop_single_context",
    "equivalence",
    "fewest_sessions",
    "has_routed",
    "interval_warnings",
    "lag_effect",
    "late_arrival_warning",
    "late_arrivals",
    "latest_run",
    "load_run",
    "measurement_error",
    "mislabeled_arms",
    "needle_grades",
    "p90_coverage_note",
    "paired_design",
    "replica_moves",
    "resolve_run_dir",
    "routing_headline",
    "run_summary",
    "session_speedup",
    "session_totals",
    "speedup_table",
    "time_scale_remedy",
    "trust_warnings",
]
