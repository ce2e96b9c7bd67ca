"""A loaded run: the manifest plus the requests in modeled seconds, ready for analysis.

- **Modeled seconds.** ``requests.parquet`` holds measured wall seconds. :func:`load_run`
  converts every duration column (``*_s``) to modeled seconds: ``measured /
  manifest["target"]["time_scale"]`` (:func:`sessiongen.records.io.time_scale`). Real targets
  have time scale 1, so modeled equals measured.
- **Warm-up rows** (``warmup == True``) are dropped at load; :attr:`Run.warmup_rows`
  counts them. Missing optional columns are added as nulls, and a null
  ``context_tokens`` becomes 0, so every frame can group by it.
- **Rows used for latency**: :attr:`Run.ok` (status ``"ok"`` with a TTFT). Other rows
  are errors, counted per arm and turn and left out of latency statistics.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sessiongen.errors import RunDirError
from sessiongen.records import io as records

ARM_KEYS = ("placement", "cache")
CELL_KEYS = ("placement", "cache", "context_tokens", "turn")
REQUIRED_COLUMNS = ("placement", "cache", "turn", "warmup", "status", "ttft_s")
RUN_ENV_VAR = "SESSIONGEN_RUN"
DURATION_COLUMNS = tuple(name for name in records.REQUEST_SCHEMA if name.endswith("_s"))


@dataclass(frozen=True)
class Run:
    """A loaded run: its manifest and its non-warm-up requests in modeled seconds."""

    path: Path
    manifest: dict[str, Any]
    requests: pl.DataFrame
    metrics: pl.DataFrame | None = None
    warmup_rows: int = 0

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    @property
    def scenario_name(self) -> str:
        return str(self.manifest.get("scenario_name", "?"))

    @property
    def time_scale(self) -> float:
        return records.time_scale(self.manifest)

    @property
    def simulated(self) -> bool:
        target = self.manifest.get("target", {})
        return bool(target.get("simulated", target.get("kind") == "sim"))

    @property
    def seconds(self) -> str:
        """What durations are in: "modeled seconds" for simulated runs, else "seconds"."""
        return "modeled seconds" if self.simulated else "seconds"

    @property
    def target_label(self) -> str:
        """``SIMULATED`` for simulated targets, else the target kind."""
        kind = str(self.manifest.get("target", {}).get("kind", "?"))
        return f"SIMULATED ({kind})" if self.simulated else kind

    @property
    def scenario(self) -> dict[str, Any]:
        return dict(self.manifest.get("scenario") or {})

    @property
    def shared_prefix_tokens(self) -> int:
        return int(self.scenario.get("sessions", {}).get("shared_prefix_tokens", 0) or 0)

    @property
    def probe(self) -> str:
        return str(self.scenario.get("sessions", {}).get("probe", "none"))

    @property
    def turns(self) -> int:
        """Turns per session: from the scenario, else the largest turn seen."""
        turns = self.scenario.get("sessions", {}).get("turns")
        if turns:
            return int(turns)
        return int(self.requests["turn"].max() or 0)  # type: ignore[arg-type]

    @property
    def ok(self) -> pl.DataFrame:
        """Rows usable for latency statistics: status ok with a TTFT."""
        return self.requests.filter((pl.col("status") == "ok") & pl.col("ttft_s").is_not_null())

    def filter(self, *predicates: pl.Expr) -> Run:
        """The same run restricted to some requests (e.g. one context size or placement)."""
        return replace(self, requests=self.requests.filter(*predicates))


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder: manifest, requests (warm-up dropped, modeled seconds), metrics."""
    path = Path(run_dir)
    manifest = records.read_manifest(path)
    raw = records.read_requests(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise RunDirError(f"{path / 'requests.parquet'}: missing columns: {', '.join(missing)}")
    scale = records.time_scale(manifest)
    if not scale > 0:
        raise RunDirError(f"{path / 'manifest.json'}: target.time_scale: expected > 0")
    for name, dtype in records.REQUEST_SCHEMA.items():
        if name not in raw.columns:
            raw = raw.with_columns(pl.lit(None, dtype=dtype).alias(name))
    warm = pl.col("warmup").fill_null(False)
    requests = raw.filter(~warm).with_columns(
        pl.col("context_tokens").fill_null(0),
        pl.col("status").fill_null("unknown"),  # never silently neither ok nor an error
        *[(pl.col(c) / scale).alias(c) for c in DURATION_COLUMNS],
    )
    metrics_path = path / "metrics.parquet"
    metrics = pl.read_parquet(metrics_path) if metrics_path.is_file() else None
    return Run(path, manifest, requests, metrics, raw.height - requests.height)


def latest_run(runs_dir: str | Path = "runs") -> Path:
    """The newest run folder under ``runs_dir`` (run ids sort by time)."""
    root = Path(runs_dir)
    found = sorted(p.parent for p in root.glob("*/manifest.json"))
    if not found:
        raise RunDirError(f"{root}: no run folders (with a manifest.json)")
    return found[-1]


def resolve_run_dir(explicit: str | Path | None = None, start: str | Path | None = None) -> Path:
    """The run folder to analyse: ``explicit``, else ``$SESSIONGEN_RUN``, else the newest
    run under the nearest ``runs/`` folder at or above ``start`` (default: the cwd)."""
    chosen = explicit or os.environ.get(RUN_ENV_VAR)
    if chosen:
        return Path(chosen)
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "runs").is_dir():
            return latest_run(folder / "runs")
    raise RunDirError(f"{here}: no runs/ folder here or above; set {RUN_ENV_VAR}=RUN_DIR")


def drop_single_context(frame: pl.DataFrame) -> pl.DataFrame:
    """Drop ``context_tokens`` from a frame for display when it holds one value."""
    if "context_tokens" in frame.columns and frame["context_tokens"].n_unique() <= 1:
        return frame.drop("context_tokens")
    return frame


def finite_or_none(value: float | None) -> float | None:
    """A float, or None for NaN/None (frames hold nulls, not NaN)."""
    return None if value is None or math.isnan(value) else float(value)


def partition(
    frame: pl.DataFrame, keys: Sequence[str]
) -> list[tuple[dict[str, Any], pl.DataFrame]]:
    """The frame split by ``keys``: (key values by name, sub-frame) in first-seen order."""
    if frame.is_empty():
        return []
    parts = frame.partition_by(list(keys), as_dict=True, maintain_order=True)
    return [(dict(zip(keys, key, strict=True)), sub) for key, sub in parts.items()]


def frame_from_rows(
    rows: list[dict[str, Any]],
    keys: Sequence[str],
    source: pl.DataFrame,
    values: dict[str, pl.DataType],
) -> pl.DataFrame:
    """Rows as a frame: key columns typed as in ``source``, then ``values`` (empty-safe)."""
    schema: dict[str, pl.DataType] = {k: source.schema[k] for k in keys}
    schema.update(values)
    return pl.DataFrame(rows, schema=schema)


def sample(frame: pl.DataFrame, column: str = "ttft_s") -> np.ndarray:
    """A column's non-null values as a float array."""
    return frame[column].drop_nulls().to_numpy().astype(np.float64)
