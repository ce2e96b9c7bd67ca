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

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis import stats
from sessiongen.analysis.frames import rows_frame
from sessiongen.analysis.runnoise import RunNoise
from sessiongen.analysis.stats import expanded_conf
from sessiongen.errors import UserError
from sessiongen.records.format import CELL_KEYS as CELL
from sessiongen.trend.stepdetect import (
    StepFit,
    fit_steps,
    latest_shift,
    pooled_night_noise,
    sigma_from_ci,
)
from sessiongen.trend.store import changed_versions, load_store

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
#: Count metrics that are regressions at any size on the newest night.
ANY_SIZE = ("cache_failures", "contamination")


# --- series ------------------------------------------------------------------------------


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


def _aligned(sub: pl.DataFrame, nights: Nights, column: str) -> NDArray[np.float64]:
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


def _cells(frame: pl.DataFrame, nights: Nights, metric: Metric) -> list[_Cell]:
    """Every cell's series of one metric, aligned on the nights."""
    rows = frame.filter(pl.col(metric.column).is_not_null())
    if metric.cache is not None:
        rows = rows.filter(pl.col("cache") == metric.cache)
    keys = [k for k in CELL if k != "cache" or metric.cache is None]
    return [
        _Cell(
            _cell(keys, key),
            _aligned(sub, nights, metric.column),
            _aligned(sub, nights, metric.ci_low),
            _aligned(sub, nights, metric.ci_high),
            _aligned(sub, nights, metric.log_se),
            _aligned(sub, nights, metric.sessions),
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
    cells = _cells(frame, nights, metric)
    prior = pooled_night_noise([(c.logs, c.sigma) for c in cells])
    out = []
    for c in cells:
        fit = fit_steps(c.logs, c.sigma, night_noise_prior=prior, min_size=min(2, min_nights))
        finding = _judge(metric, fit, nights, c.values, threshold, min_nights)
        if finding is not None:
            finding = {**finding, **c.cell}
        out.append(Series(metric, c.cell, c.values, c.low, c.high, fit, finding))
    return out


def _legacy_cache_failures() -> pl.Expr:
    """Per cell, for stores without ``cache_failures`` (see the module docstring)."""
    wrong = (pl.col("needle_graded") - pl.col("needle_correct")).fill_null(0)
    both_arms = pl.col("cache").n_unique() == 2
    on_wrong = wrong.filter(pl.col("cache") == "on").sum()
    off_wrong = wrong.filter(pl.col("cache") == "off").sum()
    divergences = pl.col("divergences").fill_null(0).max()
    needles = pl.when(both_arms & (off_wrong == 0)).then(on_wrong).otherwise(0)
    return pl.when(both_arms).then(divergences).otherwise(0) + needles


def cell_counts(frame: pl.DataFrame) -> pl.DataFrame:
    """Per run, placement, context and turn: cache failures, contamination and errors.

    ``legacy`` marks cells counted from a store without ``cache_failures``.
    """
    if "cache_failures" not in frame.columns:
        frame = frame.with_columns(cache_failures=pl.lit(None, dtype=pl.UInt32))
    legacy = pl.col("cache_failures").is_null().all()
    return frame.group_by("run_id", "placement", "context_tokens", "turn").agg(
        cache_failures=pl.when(legacy)
        .then(_legacy_cache_failures())
        .otherwise(pl.col("cache_failures").fill_null(0).sum()),
        contamination=pl.col("contamination").fill_null(0).sum(),
        errors=pl.col("errors").fill_null(0).sum(),
        requests=(pl.col("n").fill_null(0) + pl.col("errors").fill_null(0)).sum(),
        legacy=legacy,
    )


def night_counts(frame: pl.DataFrame, nights: Nights) -> dict[str, NDArray[np.float64]]:
    """Per night: cache failures, contamination, failed requests and all requests."""
    names = (*ANY_SIZE, "errors", "requests")
    totals = cell_counts(frame).group_by("run_id").agg(pl.col(*names).sum())
    return {name: _aligned(totals, nights, name) for name in names}


#: Level of the test that the newest nights' error rate is above the earlier nights'.
ERROR_ALPHA = 0.01


def errors_above_baseline(
    errors: NDArray[np.float64], requests: NDArray[np.float64], start: int
) -> bool:
    """Whether nights ``start..`` (the newest ``min_nights``) fail requests more often
    than the nights before them.

    Failed requests have a rate of their own on every target (a replica's occasional
    timeout); an alarm on any error at all fired night after night on a store whose rate
    never changed. The newest nights' pooled rate is tested against the earlier nights'
    (one-sided exact test, :func:`~sessiongen.analysis.stats.rate_exceeds`, level
    :data:`ERROR_ALPHA`). With fewer than two earlier nights there is no baseline, and
    errors on each of the newest nights are a finding, as before.
    """
    e = np.nan_to_num(errors)
    r = np.nan_to_num(requests)
    if start < 2 or r[:start].sum() <= 0:
        return True
    p = stats.rate_exceeds(
        int(e[start:].sum()), int(r[start:].sum()), int(e[:start].sum()), int(r[:start].sum())
    )
    return p < ERROR_ALPHA


def _count_detail(frame: pl.DataFrame, run_id: str, name: str) -> str:
    """The cells of one night where a count is nonzero, briefly."""
    night = frame.filter(pl.col("run_id") == run_id)
    if name == "cache_failures":  # ON answers, judged per cell
        rows = cell_counts(night).with_columns(cache=pl.lit("on"), _n=pl.col(name))
    else:
        rows = night.with_columns(_n=pl.col(name).fill_null(0), legacy=pl.lit(False))
    rows = rows.filter(pl.col("_n") > 0).sort(*CELL)
    parts = [
        f"{r['placement']}/{r['cache']} {r['context_tokens']} t{r['turn']}: {r['_n']}"
        for r in rows.iter_rows(named=True)
    ]
    text = ", ".join(parts[:3]) + (f" (+{len(parts) - 3} more)" if len(parts) > 3 else "")
    if rows["legacy"].any():
        text += " (store without cache_failures: counted from divergences and needle grades)"
    return text


def count_findings(frame: pl.DataFrame, nights: Nights, min_nights: int) -> list[Finding]:
    """Correctness and contamination at any size on the newest night; persistent errors."""
    out: list[Finding] = []
    every = night_counts(frame, nights)
    for name in (*ANY_SIZE, "errors"):
        counts = every[name]
        seen = np.nan_to_num(counts) > 0
        trailing = len(seen) - (np.flatnonzero(~seen)[-1] + 1 if (~seen).any() else 0)
        needed = 1 if name in ANY_SIZE else min_nights
        if trailing < needed:
            continue
        start = len(seen) - trailing
        if name == "errors":
            newest = len(seen) - needed
            if not errors_above_baseline(counts, every["requests"], newest):
                continue
            if newest >= 2:  # the rise is dated to the nights tested against the rest
                start = newest
                trailing = needed
        prev = nights.versions[start - 1] if start else nights.versions[start]
        out.append(
            {
                "kind": "regression",
                "metric": name,
                "started": nights.labels[start],
                "started_run": nights.run_ids[start],
                "nights": trailing,
                "before": float(counts[start - 1]) if start else None,
                "after": float(counts[-1]),
                "detail": _count_detail(frame, nights.run_ids[-1], name),
                "versions_changed": changed_versions(prev, nights.versions[start]),
            }
        )
    return out


# --- check -------------------------------------------------------------------------------

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
        cells = _cells(sub, nights, metric)
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
