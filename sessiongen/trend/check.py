"""The nightly trend: regression detection over the trend store, and its plots.

The library entry point of ``sessiongen trend check`` is :func:`trend_check`
(:mod:`sessiongen.trend.store` describes the store, :mod:`sessiongen.trend.plot` draws
the series). Within a store folder (one scenario), targets of different kinds
(sim, endpoints, managed) form separate series.

Check
-----
Each series is one metric of one cell over the nights of a folder, oldest first:

- ``ttft``: median TTFT of a (placement, cache, context, turn) arm; lower is better.
- ``speedup``: median TTFT OFF / ON of a (placement, context, turn); higher is better.

Both are fitted on the log scale with :func:`sessiongen.trend.stepdetect.fit_steps`,
each night weighted by its bootstrap interval plus the night-to-night noise estimated
from all the folder's series of that metric (bench/trend_noise.py measures false alarms
and power). A **regression** is a newest level worse than the level before it by more
than the metric's threshold (default 5%) that has lasted at least ``min_nights`` nights;
an improvement is the mirror image. Counts are not fitted: any **cache failure** (an ON
answer wrong where the OFF arm answered the same prompt right:
:mod:`sessiongen.analysis.correctness`, the report's definition) or **contamination** on
the newest night is a regression whatever its size, and failed requests (``errors``)
are one when they occur on each of the newest ``min_nights`` nights at a rate above
the earlier nights' (:func:`errors_above_baseline`). OFF-arm
inconsistencies and ON-only disagreements are a model's limits, not the cache's, and are
not findings. Each finding names the night it started and what changed in ``versions``
between the night before and that night.

Stores written before ``cache_failures`` existed hold only ``divergences`` (answers
differing anywhere, matched by session) and the needle grades per arm. For those rows
the count falls back to what can be read safely: divergences only in cells with both
arms, and wrong needle answers of the ON arm only where the OFF arm of the same cell
answered every needle right.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sessiongen.analysis.frames import rows_frame
from sessiongen.analysis.runnoise import RunNoise
from sessiongen.errors import UserError
from sessiongen.records.format import CELL_KEYS as CELL
from sessiongen.trend.counts import ERROR_ALPHA, count_findings
from sessiongen.trend.series import (
    METRICS,
    WINDOW,
    Finding,
    Nights,
    Series,
    cells_of,
    metric_series,
    night_groups,
)
from sessiongen.trend.stepdetect import (
    pooled_night_noise,
)
from sessiongen.trend.store import load_store

# The check's front: what callers and docs' figures take from here; the series and the
# counts live in :mod:`.series` and :mod:`.counts`.
__all__ = [
    "ERROR_ALPHA",
    "FINDING_SCHEMA",
    "WINDOW",
    "CheckResult",
    "Finding",
    "check_groups",
    "store_run_noise",
    "trend_check",
]


FINDING_SCHEMA: dict[str, pl.DataType] = {
    "folder": pl.String(),
    "target_kind": pl.String(),
    "time_scale": pl.Float64(),
    "kind": pl.String(),  # regression | improvement
    "metric": pl.String(),
    "placement": pl.String(),
    "cache": pl.String(),
    "context_tokens": pl.Int64(),
    "turn": pl.Int64(),
    "started": pl.String(),  # night (date) of the first run at the new level
    "started_run": pl.String(),
    "nights": pl.Int64(),  # runs at the new level, up to the newest
    "before": pl.Float64(),
    "after": pl.Float64(),
    "change": pl.Float64(),  # after / before - 1 (fitted metrics)
    "detail": pl.String(),
    "versions_changed": pl.String(),
}


@dataclass(frozen=True)
class CheckResult:
    """What ``trend check`` found: one row per regression or improvement."""

    findings: pl.DataFrame
    series: int  # fitted series checked
    groups: dict[str, int]  # folder [target kind] -> nights checked

    @property
    def regressions(self) -> pl.DataFrame:
        return self.findings.filter(pl.col("kind") == "regression")

    @property
    def improvements(self) -> pl.DataFrame:
        return self.findings.filter(pl.col("kind") == "improvement")

    @property
    def exit_code(self) -> int:
        """1 when any regression was found, else 0 (the CLI's exit status)."""
        return 1 if self.regressions.height else 0

    def headline(self) -> str:
        """``R regressions, I improvements in S series (folder: N nights, ...)``."""
        nights = ", ".join(f"{k}: {_plural(n, 'night')}" for k, n in self.groups.items())
        return (
            f"{_plural(self.regressions.height, 'regression')}, "
            f"{_plural(self.improvements.height, 'improvement')} in {self.series} series "
            f"({nights})"
        )

    def lines(self) -> list[str]:
        """One line per finding, regressions first."""
        return [_describe(row) for row in self.findings.iter_rows(named=True)]

    def table(self) -> str:
        """Plain text for the terminal."""
        return "\n".join([self.headline(), *self.lines()])

    def markdown(self) -> str:
        """A markdown table of the findings (for the nightly summary)."""
        if self.findings.is_empty():
            return f"{self.headline()}.\n"
        head = "| | series | metric | since | nights | level | change | what changed then |"
        out = [f"{self.headline()}.", "", head, "|---|---|---|---|---|---|---|---|"]
        for r in self.findings.iter_rows(named=True):
            out.append(
                f"| {r['kind']} | {r['folder']} [{r['target_kind']}] {_cell_text(r)} | "
                f"{r['metric']} | {r['started']} | {r['nights']} | {_levels(r)} | "
                f"{_change(r)} | {r['versions_changed'] or '-'} |"
            )
        return "\n".join(out) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _cell_text(r: Mapping[str, Any]) -> str:
    if r.get("placement") is None:
        return r.get("detail") or ""
    arm = f"{r['placement']}/{r['cache']}" if r.get("cache") else str(r["placement"])
    return f"{arm} ctx {r['context_tokens']} turn {r['turn']}"


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric == "ttft":
        return f"{value:.3f} s"
    if metric == "speedup":
        return f"{value:.2f}x"
    return f"{value:g}"


def _levels(r: Mapping[str, Any]) -> str:
    return f"{_fmt(r['metric'], r['before'])} -> {_fmt(r['metric'], r['after'])}"


def _change(r: Mapping[str, Any]) -> str:
    return "any size" if r["change"] is None else f"{r['change']:+.1%}"


def _describe(r: Mapping[str, Any]) -> str:
    changed = r["versions_changed"] or "nothing recorded"
    return (
        f"{r['kind'].upper():<11} {r['folder']} [{r['target_kind']}] {r['metric']} "
        f"{_cell_text(r)}: {_levels(r)} ({_change(r)}) since {r['started']} "
        f"({r['nights']} nights, run {r['started_run']}); changed then: {changed}"
    )


def _thresholds(threshold: float, per_metric: Mapping[str, float] | None) -> dict[str, float]:
    """Threshold per fitted metric; a UserError for unknown names or bad values."""
    known = {m.name for m in METRICS}
    out = dict.fromkeys(sorted(known), threshold)
    for name, value in (per_metric or {}).items():
        if name not in known:
            raise UserError(
                f"threshold: unknown metric {name!r} (known: {', '.join(sorted(known))})"
            )
        out[name] = value
    for name, value in out.items():
        if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
            raise UserError(f"threshold: {name}: expected a number > 0, got {value!r}")
    return out


def check_groups(
    frame: pl.DataFrame,
    threshold: float = 0.05,
    min_nights: int = 2,
    per_metric_thresholds: Mapping[str, float] | None = None,
    window: int | None = WINDOW,
) -> list[tuple[Nights, list[Series], list[Finding]]]:
    """Per folder and target kind: the nights, every fitted series and the count findings."""
    if min_nights < 1:
        raise UserError(f"min_nights: expected an integer >= 1, got {min_nights!r}")
    limits = _thresholds(threshold, per_metric_thresholds)
    out = []
    for nights, sub in night_groups(frame, window):
        series = [
            s
            for metric in METRICS
            for s in metric_series(sub, nights, metric, limits[metric.name], min_nights)
        ]
        out.append((nights, series, count_findings(sub, nights, min_nights)))
    return out


def trend_check(
    store: str | Path,
    threshold: float = 0.05,
    min_nights: int = 2,
    per_metric_thresholds: Mapping[str, float] | None = None,
    *,
    window: int | None = WINDOW,
    folders: Collection[str] | None = None,
) -> CheckResult:
    """Detect level shifts in every series of the store (see the module docstring).

    ``window`` limits each series to its newest nights; ``folders`` limits the check to
    those store folders (``<scenario_name>-<scenario_digest>``).
    """
    frame = load_store(store, folders)
    groups = check_groups(frame, threshold, min_nights, per_metric_thresholds, window)
    rows = []
    for nights, series, counts in groups:
        where = {
            "folder": nights.folder,
            "target_kind": nights.target_kind,
            "time_scale": nights.time_scale,
        }
        rows += [{**where, **f} for f in counts]
        rows += [{**where, **s.finding} for s in series if s.finding is not None]
    findings = rows_frame(rows, FINDING_SCHEMA).sort(
        pl.col("kind") != "regression",
        "folder",
        "target_kind",
        "metric",
        *CELL,
        nulls_last=False,
    )
    return CheckResult(
        findings,
        series=sum(len(series) for _n, series, _c in groups),
        groups={nights.key: len(nights.run_ids) for nights, _s, _c in groups},
    )


def store_run_noise(store: str | Path, run: Any) -> RunNoise:
    """The run-to-run noise of a run's cells as the trend store measured it.

    The store's nights of the run's scenario (folder), target kind and time scale: the
    night-to-night noise ``tau`` of the median TTFT series pooled over all their cells
    (:func:`~sessiongen.trend.stepdetect.pooled_night_noise`, at its 60% upper bound as
    the check uses it). A :class:`UserError` when the store holds fewer than three such
    nights: the noise was asked for and cannot be measured.
    """
    folder = f"{run.meta.scenario_name}-{run.meta.scenario_digest}"
    frame = load_store(store, {folder})
    metric = METRICS[0]
    for nights, sub in night_groups(frame):
        same_kind = nights.target_kind == run.meta.target_kind
        if not same_kind or not math.isclose(nights.time_scale, run.time_scale, rel_tol=1e-9):
            continue
        if len(nights.run_ids) < 3:
            break
        cells = cells_of(sub, nights, metric)
        tau = pooled_night_noise([(c.logs, c.sigma) for c in cells])
        diffs = sum(max(0, int(np.isfinite(c.logs).sum()) - 1) for c in cells)
        return RunNoise(
            tau,
            f"the trend store's night-to-night noise over {len(nights.run_ids)} nights",
            float(diffs),
        )
    raise UserError(
        f"{store}: fewer than 3 nights of {folder} [{run.meta.target_kind}] at time scale "
        f"{run.time_scale:g} in the trend store: cannot measure the run-to-run noise"
    )
