"""The trend store: one Parquet file per run, per scenario folder, written atomically.

``STORE/<scenario_name>-<scenario_digest>/<run_id>.parquet`` holds
:func:`sessiongen.analysis.run_summary` of the run (one row per placement, cache,
context size and turn: median TTFT with its interval, the ON/OFF speedup with its
interval, error, contamination, divergence and needle counts, and the
correctness counts ``cache_failures``, ``off_inconsistent`` and ``on_only``, which
:mod:`sessiongen.trend.check` reads with a fallback for files without them) plus the
run's identity on every row: run id, start time, night (its UTC date), scenario, target kind, and
``versions`` (JSON): sessiongen version and git SHA, server versions, the simulator
profile, a planted fault: whatever can explain a change between two nights.

Runs of different scenarios (name or digest) live in different folders and are never
compared. Adding a run that is already stored changes nothing (and reads no more than
its manifest). :mod:`sessiongen.trend.check` checks and plots what is stored here.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen.analysis import load_run, run_summary
from sessiongen.errors import RunDirError, UserError
from sessiongen.infra.files import ensure_dir
from sessiongen.records import io
from sessiongen.records.io import atomic_write_parquet
from sessiongen.records.meta import RunMeta

STORE_VERSION = 1
IDENTITY_SCHEMA: dict[str, pl.DataType] = {
    "store_version": pl.Int32(),
    "run_id": pl.String(),
    "started_at": pl.String(),
    "night": pl.String(),
    "scenario_name": pl.String(),
    "scenario_digest": pl.String(),
    "target_kind": pl.String(),
    "simulated": pl.Boolean(),
    "versions": pl.String(),
    "time_scale": pl.Float64(),
}


@dataclass(frozen=True)
class RunIdentity:
    """What the store keeps about a run besides its summary."""

    run_id: str
    scenario_name: str
    scenario_digest: str
    started_at: str
    target_kind: str
    simulated: bool
    versions: dict[str, str] = field(default_factory=dict)
    time_scale: float = 1.0

    @classmethod
    def of(cls, meta: RunMeta) -> RunIdentity:
        """The identity of a run from its parsed manifest."""
        return cls(
            run_id=meta.run_id,
            scenario_name=meta.scenario_name,
            scenario_digest=meta.scenario_digest,
            started_at=meta.started_at,
            target_kind=meta.target_kind,
            simulated=meta.simulated,
            versions=versions_of(meta),
            time_scale=meta.time_scale,
        )

    @property
    def folder(self) -> str:
        return f"{self.scenario_name}-{self.scenario_digest}"


def versions_of(meta: RunMeta) -> dict[str, str]:
    """Flat ``name -> value`` of what can explain a change: tool, servers, sim profile."""
    tool, target = meta.tool, meta.target
    out = {
        "sessiongen": str(tool.get("sessiongen_version")),
        "git_sha": str(tool.get("git_sha"))[:12],
        "target": str(target.get("kind")),
    }
    profile = target.get("profile") or target.get("sim") or {}  # "sim" in older manifests
    for key, value in profile.items():
        out[f"sim.{key}"] = json.dumps(value)
    for path, value in _leaves(target):
        if "version" in path.lower() and not path.startswith(("profile.", "sim.")):
            out[path] = json.dumps(value) if not isinstance(value, str) else value
    fault = meta.planted_fault
    if fault is not None:  # a canary run: a change it shows is the fault, say so
        out["planted_fault"] = fault
    return out


def _leaves(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted path, value) of every leaf of nested dicts and lists."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), node


def changed_versions(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """``name: old -> new`` for every entry that differs, ``; ``-separated."""
    keys = sorted(set(before) | set(after))
    parts = [
        f"{k}: {before.get(k, '-')} -> {after.get(k, '-')}"
        for k in keys
        if before.get(k) != after.get(k)
    ]
    return "; ".join(parts)


# --- store -------------------------------------------------------------------------------


def add_summary(store: str | Path, summary: pl.DataFrame, identity: RunIdentity) -> Path | None:
    """Store one run's summary; None (and no write) when the run is already there."""
    folder = Path(store) / identity.folder
    path = folder / f"{identity.run_id}.parquet"
    if path.exists():
        return None
    ensure_dir(folder)
    ident = {
        "store_version": STORE_VERSION,
        "run_id": identity.run_id,
        "started_at": identity.started_at,
        "night": identity.started_at[:10],
        "scenario_name": identity.scenario_name,
        "scenario_digest": identity.scenario_digest,
        "target_kind": identity.target_kind,
        "simulated": identity.simulated,
        "versions": json.dumps(identity.versions, sort_keys=True),
        "time_scale": identity.time_scale,
    }
    frame = summary.with_columns(
        pl.lit(value, dtype=IDENTITY_SCHEMA[name]).alias(name) for name, value in ident.items()
    )
    atomic_write_parquet(path, frame)
    return path


def trend_add(run_dirs: Iterable[str | Path], store: str | Path) -> list[Path]:
    """Add each run folder's summary to the store; return the files newly written.

    Every run is read and summarized before anything is written, so one bad folder adds
    nothing. Incomplete (interrupted) runs are refused. Runs already stored are skipped
    after reading their manifest only.
    """
    prepared = []
    for run_dir in run_dirs:
        identity = RunIdentity.of(io.read_meta(Path(run_dir)))
        if (Path(store) / identity.folder / f"{identity.run_id}.parquet").exists():
            continue
        run = load_run(run_dir)
        if not run.meta.complete:
            raise RunDirError(f"{run.path}: incomplete run (interrupted?); not added to trend")
        prepared.append((run_summary(run.levels_apart()), identity))
    added = [add_summary(store, summary, ident) for summary, ident in prepared]
    return [p for p in added if p is not None]


def load_store(store: str | Path, folders: Collection[str] | None = None) -> pl.DataFrame:
    """Stored summary rows (of ``folders`` only, if given) with a ``folder`` column.

    A :class:`UserError` when there is no run to read.
    """
    root = Path(store)
    files = sorted(root.glob("*/*.parquet")) if root.is_dir() else []
    if folders is not None:
        files = [f for f in files if f.parent.name in folders]
    if not files:
        which = f" for {', '.join(sorted(folders))}" if folders else ""
        raise UserError(f"{root}: no runs in the trend store{which} (add some with trend add)")
    frames = [_read_summary(f).with_columns(folder=pl.lit(f.parent.name)) for f in files]
    return pl.concat(frames, how="diagonal_relaxed")


#: Columns a stored summary must have for the check to read it.
REQUIRED_COLUMNS = ("run_id", "started_at", "night", "target_kind", "versions", "placement")


def _read_summary(path: Path) -> pl.DataFrame:
    """One stored run; a one-line :class:`RunDirError` naming the file when it is broken."""
    try:
        frame = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise RunDirError(f"{path}: unreadable: {str(exc).splitlines()[0][:160]}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise RunDirError(f"{path}: not a trend-store file (missing {', '.join(missing)})")
    return frame
