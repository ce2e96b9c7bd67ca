"""Calibrate the client: how much time the driver itself adds to every TTFT it reports.

- :mod:`.refserver`: the reference server (known delay, kernel receive stamps);
- :mod:`.measure`: the measurements: added TTFT, steady and burst, stream rate;
- :mod:`.verdict`: what they say, in words: the verdict first, then the figures.
"""

from sessiongen.calibrate.measure import calibrate, calibrate_at, scenario_load
from sessiongen.calibrate.refserver import ReferenceServer
from sessiongen.calibrate.verdict import DEFINITION, figure_lines, verdict

__all__ = [
    "DEFINITION",
    "ReferenceServer",
    "calibrate",
    "calibrate_at",
    "figure_lines",
    "scenario_load",
    "verdict",
]
