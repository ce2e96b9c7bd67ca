"""A loaded run: the manifest plus the requests in modeled seconds, ready for analysis.

- **Modeled seconds.** ``requests.parquet`` holds measured wall seconds. :func:`load_run`
  converts every duration column (``*_s``) to modeled seconds: ``measured /
  manifest["target"]["time_scale"]`` (:attr:`RunMeta.time_scale`). Real targets have
  time scale 1, so modeled equals measured.
- **Warm-up rows** (``warmup == True``) are dropped at load; :attr:`Run.warmup_rows`
  counts them. Missing optional columns are added as nulls, and a null
  ``context_tokens`` becomes 0, so every frame can group by it.
- **Rows used for latency**: :attr:`Run.ok` (status ``"ok"`` with a TTFT). Other rows
  are errors, counted per arm and turn and left out of latency statistics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen.errors import RunDirError
from sessiongen.records import io
from sessiongen.records.format import REQUEST_SCHEMA
from sessiongen.records.meta import RunMeta

REQUIRED_COLUMNS = ("placement", "cache", "turn", "warmup", "status", "ttft_s")
RUN_ENV_VAR = "SESSIONGEN_RUN"
DURATION_COLUMNS = tuple(name for name in REQUEST_SCHEMA if name.endswith("_s"))


@dataclass(frozen=True)
class Run:
    """A loaded run: its manifest and its non-warm-up requests in modeled seconds."""

    path: Path
    meta: RunMeta
    requests: pl.DataFrame
    metrics: pl.DataFrame | None = None
    warmup_rows: int = 0

    @property
    def manifest(self) -> Mapping[str, Any]:
        """The manifest as written (JSON); :attr:`meta` has it parsed."""
        return self.meta.raw

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    @property
    def scenario_name(self) -> str:
        return self.meta.scenario_name

    @property
    def time_scale(self) -> float:
        return self.meta.time_scale

    @property
    def simulated(self) -> bool:
        return self.meta.simulated

    @property
    def modeled(self) -> bool:
        """Durations are modeled seconds (:attr:`RunMeta.modeled`)."""
        return self.meta.modeled

    @property
    def seconds(self) -> str:
        """What durations are in: "modeled seconds" for simulated runs, else "seconds"."""
        return self.meta.seconds

    @property
    def target_label(self) -> str:
        """``SIMULATED (kind)`` for simulated targets, else the target kind."""
        return self.meta.target_label

    @property
    def shared_prefix_tokens(self) -> int:
        return self.meta.shared_prefix_tokens

    @property
    def probe(self) -> str:
        return self.meta.probe

    @property
    def trace(self) -> bool:
        """The run replayed a trace: sessions of their own lengths, prefixes it says."""
        return self.meta.trace

    @property
    def turns(self) -> int:
        """Turns per session: from the scenario, else the largest turn seen."""
        if self.meta.turns:
            return self.meta.turns
        top = self.requests["turn"].max()
        return int(top) if isinstance(top, int) else 0

    @property
    def ok(self) -> pl.DataFrame:
        """Rows usable for latency statistics: status ok with a TTFT."""
        return self.requests.filter((pl.col("status") == "ok") & pl.col("ttft_s").is_not_null())

    def filter(self, *predicates: pl.Expr) -> Run:
        """The same run restricted to some requests (e.g. one context size or placement)."""
        return replace(self, requests=self.requests.filter(*predicates))

    def levels_apart(self) -> Run:
        """The run with each load level as its own placement (``fixed @ 16``) when it swept
        several, so that per-arm statistics never pool requests made at different loads;
        the run itself when it ran one level."""
        levels = self.requests["load_level"].drop_nulls().unique()
        if levels.len() < 2:
            return self
        level = pl.col("load_level")
        text = {v: f"{v:g}" for v in levels.to_list()}
        label = pl.concat_str(
            pl.col("placement"), pl.lit(" @ "), level.replace_strict(text, return_dtype=pl.String)
        )
        named = pl.when(level.is_null()).then(pl.col("placement")).otherwise(label)
        return replace(self, requests=self.requests.with_columns(named.alias("placement")))


def one_in_flight(meta: RunMeta) -> pl.Expr:
    """Rows sent while no other session was in flight, so that their times hold no wait
    behind another request: closed-loop arrivals at one session (load level 1, or no
    level with the driver's concurrency 1). Open-loop arrivals (Poisson, gamma, a
    trace's timestamps) are never alone by design."""
    load = meta.scenario.get("load") or {}
    driver = meta.scenario.get("driver") or {}
    if load.get("arrival", "closed") != "closed" or meta.trace:
        return pl.lit(False)
    one = pl.col("load_level") == 1
    if driver.get("concurrency", 1) == 1:  # the schema's default where a manifest omits it
        one = one | pl.col("load_level").is_null()
    return one.fill_null(False)


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder: manifest, requests (warm-up dropped, modeled seconds), metrics."""
    path = Path(run_dir)
    meta = io.read_meta(path)
    raw = io.read_requests(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise RunDirError(f"{path / 'requests.parquet'}: missing columns: {', '.join(missing)}")
    scale = meta.time_scale
    if not scale > 0:
        raise RunDirError(f"{path / 'manifest.json'}: target.time_scale: expected > 0")
    for name, dtype in REQUEST_SCHEMA.items():
        if name not in raw.columns:
            raw = raw.with_columns(pl.lit(None, dtype=dtype).alias(name))
    warm = pl.col("warmup").fill_null(False)
    requests = raw.filter(~warm).with_columns(
        pl.col("context_tokens").fill_null(0),
        pl.col("status").fill_null("unknown"),  # never silently neither ok nor an error
        *[(pl.col(c) / scale).alias(c) for c in DURATION_COLUMNS],
    )
    metrics_path = path / "metrics.parquet"
    try:
        metrics = pl.read_parquet(metrics_path) if metrics_path.is_file() else None
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise RunDirError(f"{metrics_path}: unreadable: {str(exc).splitlines()[0][:160]}") from None
    return Run(path, meta, requests, metrics, raw.height - requests.height)


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
