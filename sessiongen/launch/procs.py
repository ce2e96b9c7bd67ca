"""The record of a started server process group that outlives the process that started it.

A :class:`ProcessRecord` holds what a later ``sessiongen pair down`` needs to find the
same group again (:mod:`sessiongen.infra.procs` starts, watches and stops groups), and
what a run manifest needs to say what ran (argv, environment overrides, port, log).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProcessRecord:
    """One started server process group: how it was started and how to find it again."""

    role: str
    """``"lmcache"``, ``"replica"`` or ``"router"``."""
    index: int
    """Replica index (0 for the LMCache server and a router)."""
    argv: tuple[str, ...]
    env: dict[str, str]
    """Only the variables sessiongen set on top of its own environment."""
    pid: int
    pgid: int
    starttime: int | None
    """Start time of the leader in clock ticks since boot (``/proc/PID/stat``), to tell
    our process from a later one that reuses its pid."""
    port: int
    url: str
    """Base URL (replicas: the OpenAI API; LMCache: its HTTP API)."""
    health_url: str
    log: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Short display name: ``lmcache``, ``router`` or ``replica-N``."""
        return f"{self.role}-{self.index}" if self.role == "replica" else self.role

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (state file, manifest)."""
        data = asdict(self)
        data["argv"] = list(self.argv)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRecord:
        """Inverse of :meth:`to_dict`."""
        fields = dict(data)
        fields["argv"] = tuple(fields["argv"])
        return cls(**fields)
