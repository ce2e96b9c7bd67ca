"""The nightly trend: a store of run summaries, change-point detection, plots, the job.

- :mod:`.store`: one Parquet summary per run, per scenario folder (:func:`trend_add`);
- :mod:`.stepdetect`: the penalized, robust piecewise-constant fit;
- :mod:`.check`: findings and :func:`trend_check`, over
  - :mod:`.series`: the nights per folder, target kind and time scale, and each fitted
    metric's series of each cell with its step fit;
  - :mod:`.counts`: the counted metrics (cache failures, contamination, errors);
- :mod:`.plot`: the trend figures (:func:`trend_plot`);
- :mod:`.nightly`: the nightly job (:func:`run_nightly`).
"""

from sessiongen.trend.check import CheckResult, store_run_noise, trend_check
from sessiongen.trend.nightly import NightlyResult, run_nightly
from sessiongen.trend.plot import trend_plot
from sessiongen.trend.series import WINDOW
from sessiongen.trend.store import STORE_VERSION, RunIdentity, load_store, trend_add

__all__ = [
    "STORE_VERSION",
    "WINDOW",
    "CheckResult",
    "NightlyResult",
    "RunIdentity",
    "load_store",
    "run_nightly",
    "store_run_noise",
    "trend_add",
    "trend_check",
    "trend_plot",
]
