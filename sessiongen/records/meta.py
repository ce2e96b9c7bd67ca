"""A run's manifest parsed once (:class:`RunMeta`): every fact a reader needs, typed, with
the defaults of older schema versions; the manifest's shape is :mod:`.format`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunMeta:
    """A manifest parsed once: every fact a reader needs, typed, with old defaults."""

    run_id: str
    scenario_name: str
    scenario_digest: str
    started_at: str
    ended_at: str | None
    complete: bool | None
    time_scale: float
    simulated: bool
    target_kind: str
    time_scale_known: bool
    scenario: Mapping[str, Any]
    target: Mapping[str, Any]
    tool: Mapping[str, Any]
    blocks: tuple[Mapping[str, Any], ...]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], fallback_id: str = "?") -> RunMeta:
        """Parse a manifest of any schema version this code reads."""
        target = manifest.get("target") or {}
        kind = str(target.get("kind", "?"))
        return cls(
            run_id=str(manifest.get("run_id") or fallback_id),
            scenario_name=str(manifest.get("scenario_name", "?")),
            scenario_digest=str(manifest.get("scenario_digest") or "nodigest"),
            started_at=str(manifest.get("started_at") or ""),
            ended_at=manifest.get("ended_at"),
            complete=manifest.get("complete"),
            time_scale=float(target.get("time_scale", 1.0)),
            simulated=bool(target.get("simulated", kind == "sim")),
            target_kind=kind,
            time_scale_known=bool(target.get("time_scale_known", True)),
            scenario=manifest.get("scenario") or {},
            target=target,
            tool=manifest.get("tool") or {},
            blocks=tuple(manifest.get("blocks") or ()),
            raw=manifest,
        )

    @property
    def sessions(self) -> Mapping[str, Any]:
        """The scenario's ``[sessions]`` section as resolved."""
        return self.scenario.get("sessions") or {}

    @property
    def probe(self) -> str:
        return str(self.sessions.get("probe", "none"))

    @property
    def shared_prefix_tokens(self) -> int:
        return int(self.sessions.get("shared_prefix_tokens", 0) or 0)

    @property
    def trace(self) -> bool:
        """The run replayed a trace (``sessions.source = "trace"``)."""
        return self.sessions.get("source") == "trace"

    @property
    def dataset(self) -> bool:
        """The run replayed a conversation dataset (``sessions.source = "sharegpt"``)."""
        return self.sessions.get("source") == "sharegpt"

    @property
    def turns(self) -> int | None:
        """Turns per session as the scenario says; None for a trace or a conversation
        dataset (their sessions have their own numbers of turns) or when the scenario
        does not say."""
        turns = self.sessions.get("turns")
        return int(turns) if turns and not self.trace and not self.dataset else None

    @property
    def modeled(self) -> bool:
        """Durations are modeled seconds: a simulated target whose time scale is known."""
        return self.simulated and self.time_scale_known

    @property
    def seconds(self) -> str:
        """What durations are in: "modeled seconds" for simulated runs (whose time scale
        is known), else "seconds"."""
        return "modeled seconds" if self.modeled else "seconds"

    @property
    def target_label(self) -> str:
        """``SIMULATED (kind)`` for simulated targets, else the target kind."""
        return f"SIMULATED ({self.target_kind})" if self.simulated else self.target_kind

    @property
    def planted_fault(self) -> str | None:
        """The fault planted on purpose in the run's target, or None for a healthy one.

        A run with a planted fault is a correctness canary, not a measurement of the
        stack: managed replicas record ``target.fault`` (``target.managed.fault``), the
        simulated pair its profile's ``pool_corruption``.
        """
        fault = self.target.get("fault")
        if isinstance(fault, Mapping):
            return str(fault.get("label") or fault.get("kind") or "planted fault")
        profile = self.target.get("profile") or self.target.get("sim") or {}
        share = profile.get("pool_corruption") if isinstance(profile, Mapping) else None
        if isinstance(share, int | float) and share > 0:
            return f"pool_corruption, {share * 100:g}% of the answers the pool serves corrupted"
        return None

    @property
    def fault_hits(self) -> dict[str, int] | None:
        """What a fault planted in managed replicas hit, summed over the blocks (loads,
        loads_hit, chunks, chunks_hit), or None when no block says."""
        rows = [b["fault"] for b in self.blocks if isinstance(b.get("fault"), Mapping)]
        if not rows:
            return None
        keys = ("loads", "loads_hit", "chunks", "chunks_hit")
        return {k: sum(int(row.get(k, 0)) for row in rows) for k in keys}

    def fault_line(self) -> str | None:
        """One line naming a planted fault and what it hit (None: a healthy run)."""
        fault = self.planted_fault
        if fault is None:
            return None
        hits = self.fault_hits
        what = (
            f"; it hit {hits['chunks_hit']} of the {hits['chunks']} chunks in "
            f"{hits['loads_hit']} of the {hits['loads']} loads from the pool"
            if hits is not None
            else ""
        )
        return (
            f"PLANTED FAULT: {fault}{what}. A correctness canary, not a measurement of "
            "the healthy stack."
        )

    @property
    def sessiongen_version(self) -> str | None:
        version = self.tool.get("sessiongen_version")
        return None if version is None else str(version)

    @property
    def date(self) -> str:
        """The UTC date the run started (``YYYY-MM-DD``), or empty."""
        return self.started_at[:10]
