"""The trend's series: a store's nights per folder, target kind and time scale, and each
fitted metric (TTFT, speedup) of each cell over them, with its step fit and finding.

The method is :mod:`.check`'s docstring.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis.stats import expanded_conf
from sessiongen.records.format import CELL_KEYS as CELL
from sessiongen.trend.stepdetect import (
    StepFit,
    fit_steps,
    latest_shift,
    pooled_night_noise,
    sigma_from_ci,
)
from sessiongen.trend.store import changed_versions

#: Nights fitted per series (the newest ones): enough history for a baseline, and the
#: exact fit stays fast (its cost grows with the cube of the nights on flat series).
WINDOW = 90


@dataclass(frozen=True)
class Metric:
    """A fitted series: its column, interval, standard-error and session-count columns,
    and which direction is worse."""

    name: str
    column: str
    ci_low: str
    ci_high: str
    log_se: str
    sessions: str
    higher_is_worse: bool
    cache: str | None = None  # only rows of this cache arm carry the metric


METRICS = (
    Metric("ttft", "median_ttft_s", "ci_low_s", "ci_high_s", "ttft_log_se", "sessions", True),
    Metric(
        "speedup",
        "speedup",
        "speedup_ci_low",
        "speedup_ci_high",
        "speedup_log_se",
        "speedup_sessions",
        False,
        cache="on",
    ),
)


#: The level of the stored intervals (95%, expanded for the session count: Hesterberg).
STORED_CONF = 0.95


@dataclass(frozen=True)
class Nights:
    """The runs of one folder, target kind and time scale, oldest first (at most ``window``).

    Runs of a simulated target made at different time scales carry different
    measurement errors (the client's lateness divided by the scale), so they form
    separate series, never one that would show a "change" at the night the scale did.
    """

    folder: str
    target_kind: str
    run_ids: tuple[str, ...]
    labels: tuple[str, ...]  # night dates
    versions: tuple[dict[str, str], ...]
    time_scale: float = 1.0
    several_scales: bool = False  # the folder holds nights at more than one time scale

    @property
    def key(self) -> str:
        scale = f", time scale {self.time_scale:g}" if self.several_scales else ""
        return f"{self.folder} [{self.target_kind}{scale}]"


class TrendCell(TypedDict, total=False):
    """A series' cell (:data:`CELL`): no ``cache`` for a speedup, which spans both arms."""

    placement: str
    cache: str
    context_tokens: int
    turn: int


class Finding(TypedDict, total=False):
    """A regression or improvement: a row of :data:`FINDING_SCHEMA` but where it was found."""

    kind: str  # regression | improvement
    metric: str
    started: str  # night (date) of the first run at the new level
    started_run: str
    nights: int
    before: float | None
    after: float
    change: float  # fitted metrics
    detail: str  # counted metrics
    versions_changed: str
    placement: str  # the cell of a fitted metric
    cache: str
    context_tokens: int
    turn: int


def _cell(keys: Sequence[str], key: tuple[Any, ...]) -> TrendCell:
    """A partition's key (polars' values for ``keys``) as the cell it names."""
    values = dict(zip(keys, key, strict=True))
    cell: TrendCell = {
        "placement": str(values["placement"]),
        "context_tokens": int(values["context_tokens"]),
        "turn": int(values["turn"]),
    }
    if "cache" in values:
        cell["cache"] = str(values["cache"])
    return cell


@dataclass(frozen=True)
class Series:
    """One metric of one cell over the nights, with its fit and the finding, if any."""

    metric: Metric
    cell: TrendCell
    values: NDArray[np.float64]  # NaN where a night has no value
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    fit: StepFit
    finding: Finding | None


def night_groups(
    frame: pl.DataFrame, window: int | None = WINDOW
) -> list[tuple[Nights, pl.DataFrame]]:
    """The store split by folder, target kind and time scale, each with its (newest) nights."""
    out = []
    scaled = with_time_scale(frame)
    counts = scaled.group_by("folder", "target_kind").agg(pl.col("_scale").n_unique())
    several = {
        (r["folder"], r["target_kind"]) for r in counts.iter_rows(named=True) if r["_scale"] > 1
    }
    groups = scaled.partition_by(
        "folder", "target_kind", "_scale", as_dict=True, maintain_order=True
    )
    for (folder, kind, scale), sub in groups.items():
        runs = sub.select("run_id", "started_at", "night", "versions").unique("run_id")
        runs = runs.sort("started_at", "run_id")
        if window:
            runs = runs.tail(window)
        nights = Nights(
            str(folder),
            str(kind),
            tuple(runs["run_id"].to_list()),
            tuple(runs["night"].to_list()),
            tuple(json.loads(v) for v in runs["versions"].to_list()),
            float(scale),
            (folder, kind) in several,
        )
        out.append((nights, sub.filter(pl.col("run_id").is_in(list(nights.run_ids)))))
    return out


def with_time_scale(frame: pl.DataFrame) -> pl.DataFrame:
    """The store's rows with ``_scale``: their run's time scale (stores written before the
    column existed: the simulator profile's in ``versions``, else 1)."""
    from_versions = (
        pl.col("versions").str.json_path_match("$['sim.time_scale']").cast(pl.Float64, strict=False)
    )
    column = pl.col("time_scale") if "time_scale" in frame.columns else pl.lit(None)
    return frame.with_columns(
        _scale=pl.coalesce(column.cast(pl.Float64), from_versions, pl.lit(1.0))
    )


def aligned(sub: pl.DataFrame, nights: Nights, column: str) -> NDArray[np.float64]:
    """A column of one cell's rows as an array over the nights (NaN where missing, and
    everywhere when an older store lacks the column)."""
    index = {rid: i for i, rid in enumerate(nights.run_ids)}
    out = np.full(len(nights.run_ids), np.nan)
    if column not in sub.columns:
        return out
    for rid, value in zip(sub["run_id"].to_list(), sub[column].to_list(), strict=True):
        if value is not None:
            out[index[rid]] = float(value)
    return out


def _judge(
    metric: Metric,
    fit: StepFit,
    nights: Nights,
    values: NDArray[np.float64],
    threshold: float,
    min_nights: int,
) -> Finding | None:
    """A regression or improvement when the newest level moved past the threshold."""
    shift = latest_shift(fit)
    if shift is None or shift.nights < min_nights:
        return None
    delta = shift.after - shift.before
    worse = delta if metric.higher_is_worse else -delta
    if abs(worse) <= math.log1p(threshold):
        return None
    earlier = np.flatnonzero(np.isfinite(values[: shift.at]))
    prev = int(earlier[-1]) if earlier.size else shift.at
    return {
        "kind": "regression" if worse > 0 else "improvement",
        "metric": metric.name,
        "started": nights.labels[shift.at],
        "started_run": nights.run_ids[shift.at],
        "nights": shift.nights,
        "before": math.exp(shift.before),
        "after": math.exp(shift.after),
        "change": math.expm1(delta),
        "versions_changed": changed_versions(nights.versions[prev], nights.versions[shift.at]),
    }


@dataclass(frozen=True)
class _Cell:
    """One cell's series of a metric before fitting: values, interval, logs, sigmas."""

    cell: TrendCell
    values: NDArray[np.float64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    log_se: NDArray[np.float64]
    sessions: NDArray[np.float64]

    @property
    def logs(self) -> NDArray[np.float64]:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.values > 0, np.log(self.values), np.nan)

    @property
    def sigma(self) -> NDArray[np.float64]:
        """Each night's sampling SD on the log scale: the stored standard error, else the
        interval read at the level it was made at (:func:`night_sigma`)."""
        return night_sigma(self.low, self.high, self.log_se, self.sessions)


def night_sigma(
    low: NDArray[np.float64],
    high: NDArray[np.float64],
    log_se: NDArray[np.float64],
    sessions: NDArray[np.float64],
) -> NDArray[np.float64]:
    """A night's sampling SD on the log scale.

    Stores since the standard error was kept (``*_log_se``) give it directly. Older ones
    hold only the interval, a 95% interval *expanded* for the session count (Hesterberg's
    :func:`~sessiongen.analysis.stats.expanded_conf`: 99.98% wide at 4 sessions, 98.9% at
    8); reading it as a plain 95% interval made sigma 1.2-1.9x too large at 4-8
    sessions, so night noise was underestimated. With the session count known the
    interval is read at the level it was made at; without it, as 95% (the oldest stores).
    """
    conf = np.array(
        [
            expanded_conf(STORED_CONF, int(n)) if np.isfinite(n) and n >= 2 else STORED_CONF
            for n in sessions
        ]
    )
    from_ci = np.array(
        [sigma_from_ci([lo], [hi], conf=c)[0] for lo, hi, c in zip(low, high, conf, strict=True)]
    )
    known = np.isfinite(log_se) & (log_se >= 0)
    return np.where(known, log_se, from_ci)


def cells_of(frame: pl.DataFrame, nights: Nights, metric: Metric) -> list[_Cell]:
    """Every cell's series of one metric, aligned on the nights."""
    rows = frame.filter(pl.col(metric.column).is_not_null())
    if metric.cache is not None:
        rows = rows.filter(pl.col("cache") == metric.cache)
    keys = [k for k in CELL if k != "cache" or metric.cache is None]
    return [
        _Cell(
            _cell(keys, key),
            aligned(sub, nights, metric.column),
            aligned(sub, nights, metric.ci_low),
            aligned(sub, nights, metric.ci_high),
            aligned(sub, nights, metric.log_se),
            aligned(sub, nights, metric.sessions),
        )
        for key, sub in rows.partition_by(keys, as_dict=True, maintain_order=True).items()
    ]


def metric_series(
    frame: pl.DataFrame, nights: Nights, metric: Metric, threshold: float, min_nights: int
) -> list[Series]:
    """Every cell's series of one metric, fitted and judged.

    Each night's noise is its interval's plus the night-to-night noise ``tau``, pooled
    over all the cells of this metric (:func:`~sessiongen.trend.stepdetect.pooled_night_noise`):
    the store's history, not one series' few nights, says how much nights differ.
    """
    cells = cells_of(frame, nights, metric)
    prior = pooled_night_noise([(c.logs, c.sigma) for c in cells])
    out = []
    for c in cells:
        fit = fit_steps(c.logs, c.sigma, night_noise_prior=prior, min_size=min(2, min_nights))
        finding = _judge(metric, fit, nights, c.values, threshold, min_nights)
        if finding is not None:
            finding = {**finding, **c.cell}
        out.append(Series(metric, c.cell, c.values, c.low, c.high, fit, finding))
    return out
