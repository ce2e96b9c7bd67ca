"""The error hierarchy of sessiongen.

::

    SessiongenError                 root; never raised directly
    ├── UserError                   the user can fix it; CLI prints one line, exit status 2
    │   ├── ScenarioError           a scenario file or --set override is invalid
    │   ├── EndpointError           a replica is unreachable or answers nonsense at start
    │   ├── MissingDependencyError  an optional dependency (e.g. the real stack) is absent
    │   ├── RunDirError             a run folder or trend store is missing or unreadable
    │   └── OutputError             a file or folder cannot be written (path, permission, disk)
    └── RunFailedError              a run finished but failed; exit status 1
        └── CacheFailureError       ... because ON answers were wrong where OFF was right

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SessiongenError(Exception):
    """Root of every error sessiongen raises on purpose."""


class UserError(SessiongenError):
    """Something the user can fix; shown as one line, exit status 2."""

    exit_code = 2


class ScenarioError(UserError):
    """A scenario file or override is invalid.

    The message always has the shape ``FILE: key.path: what was expected, got VALUE``.
    """

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source = source
        self.path = path
        where = f"{source}: {path}: " if path else f"{source}: "
        super().__init__(where + message)


class EndpointError(UserError):
    """An endpoint cannot be used (refused connection, wrong model, bad answer)."""


class MissingDependencyError(UserError):
    """An optional dependency is not installed."""


class RunDirError(UserError):
    """A run folder is missing, incomplete in a way that matters, or unreadable."""


class OutputError(UserError):
    """A result cannot be written: no such folder, no permission, a full disk, ..."""


class RunFailedError(SessiongenError):
    """The run finished and its records are written, but it failed: some requests failed,
    or the cache changed answers."""

    exit_code = 1


class CacheFailureError(RunFailedError):
    """The run finished, but ON answers were wrong where the OFF arm answered the same
    prompt right (:mod:`sessiongen.analysis.correctness`)."""
