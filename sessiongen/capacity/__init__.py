"""Capacity planning: fit the simulator to real runs, then ask what-if in virtual time.

- :mod:`.fit`: ``sessiongen fit``: the timing profile from real runs' records, with
  bootstrap intervals and residuals, written as a profile file a scenario can load.
"""
