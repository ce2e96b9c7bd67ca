"""The nightly trend: a store of run summaries, change-point detection, plots, the job.

- :mod:`.store`: one Parquet summary per run, per scenario folder;
- :mod:`.stepdetect`: the penalized, robust piecewise-constant fit;
- :mod:`.check`: series, findings and :func:`trend_check`;
- :mod:`.plot`: the trend figures;
- :mod:`.nightly`: the nightly job.
"""

from sessiongen.trend.check import *  # noqa: F403
from sessiongen.trend.check import __all__ as _check_all

__all__ = list(_check_all)
