"""The package's version, in a module of its own.

Low modules (the records' manifest, the simulator's server and metrics, the client's
User-Agent) read it from here: importing it from the package root would load the root's
front door, whose lazy names reach up into replay and report.
"""

__version__ = "0.1.0"
