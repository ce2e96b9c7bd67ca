"""Analysis of recorded runs with polars: the one door for the CLI, notebook and nightly job.

- :mod:`.stats`: pure, seeded statistics (bootstrap intervals, rank tests);
- :mod:`.latency`: per-turn medians, ON/OFF speedups, sessions, block drift;
- :mod:`.checks`: contamination, attribution, needle grades, equivalence;
- :mod:`.compare`: one run against another.
"""

from sessiongen.analysis.latency import *  # noqa: F403
from sessiongen.analysis.latency import __all__ as _latency_all

__all__ = list(_latency_all)
