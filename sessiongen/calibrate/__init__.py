"""Calibrate the client: how much time the driver itself adds to every TTFT it reports.

- :mod:`.measure`: the reference server and the measurements.
"""

from sessiongen.calibrate.measure import ReferenceServer, calibrate, calibrate_at, scenario_load

__all__ = ["ReferenceServer", "calibrate", "calibrate_at", "scenario_load"]
