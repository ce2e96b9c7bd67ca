"""Calibrate the client: how much time the driver itself adds to every TTFT it reports.

- :mod:`.refserver`: the reference server (known delay, kernel receive stamps);
- :mod:`.measure`: the measurements: added TTFT, steady and burst, stream rate.
"""

from sessiongen.calibrate.measure import calibrate, calibrate_at, scenario_load
from sessiongen.calibrate.refserver import ReferenceServer

__all__ = ["ReferenceServer", "calibrate", "calibrate_at", "scenario_load"]
