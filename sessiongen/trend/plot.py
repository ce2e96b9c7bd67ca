"""Trend figures: each headline series over the nights with its fitted levels and shifts.

Drawn on the Agg canvas without pyplot (no global backend state), saved as PNG atomically.
Points are the nightly values with their bootstrap intervals, the horizontal lines are
the levels :func:`sessiongen.trend.stepdetect.fit_steps` found, dotted verticals mark shifts;
a shift judged a regression is red, an improvement green (see :mod:`sessiongen.trend.check`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from sessiongen.report import figures
from sessiongen.trend.check import check_groups
from sessiongen.trend.series import WINDOW, Nights, Series
from sessiongen.trend.store import load_store

CACHE_COLORS = {"off": "#1f77b4", "on": "#ff7f0e", None: "#2ca02c"}
KIND_COLORS = {"regression": "#d62728", "improvement": "#2ca02c"}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def _figure(title: str, count: int) -> tuple[Figure, list[Axes]]:
    """Up to three panels a row; panels beyond ``count`` hidden."""
    ncols = min(3, count)
    nrows = math.ceil(count / ncols)
    fig, axes = figures.panels(
        title, nrows=nrows, ncols=ncols, panel_size=(4.6, 3.2), margin=(0.8, 1.2), constrained=True
    )
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, axes[:count]


def _draw_series(ax: Axes, series: Series, color: str, label: str) -> None:
    """Points with intervals, fitted levels, shift markers and the finding's note."""
    x = np.arange(series.values.size)
    ok = np.isfinite(series.values)
    lower = np.where(np.isfinite(series.low), series.values - series.low, 0.0)
    upper = np.where(np.isfinite(series.high), series.high - series.values, 0.0)
    err = np.clip(np.vstack([lower, upper])[:, ok], 0.0, None)
    ax.errorbar(x[ok], series.values[ok], yerr=err, fmt="o", ms=3, color=color, label=label)
    for seg in series.fit.segments:
        ax.hlines(math.exp(seg.level), seg.start - 0.4, seg.end - 0.6, colors=color, lw=2)
    finding = series.finding
    for i, at in enumerate(series.fit.steps):
        newest = i == len(series.fit.steps) - 1
        mark = KIND_COLORS.get(finding["kind"], "#888888") if finding and newest else "#888888"
        ax.axvline(at - 0.5, color=mark, ls=":", lw=1.5)
    if finding:
        note = f"{finding['kind']} {finding['change']:+.0%} since {finding['started']}"
        color = KIND_COLORS[finding["kind"]]
        ax.annotate(note, (0.02, 0.95), xycoords="axes fraction", va="top", fontsize=8, color=color)


def _night_axis(ax: Axes, labels: Sequence[str]) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda v, _pos: labels[int(v)] if 0 <= int(v) < len(labels) else "")
    )
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.set_xlim(-0.7, len(labels) - 0.3)


def _by_turn(series: list[Series]) -> dict[int, list[Series]]:
    out: dict[int, list[Series]] = {}
    for s in sorted(series, key=lambda s: (s.cell["turn"], str(s.cell.get("cache")))):
        out.setdefault(int(s.cell["turn"]), []).append(s)
    return out


def _headline_figure(nights: Nights, metric: str, title: str, series: list[Series]) -> Figure:
    turns = _by_turn(series)
    fig, axes = _figure(title, len(turns))
    unit = "median TTFT, modeled s (log)" if metric == "ttft" else "speedup OFF/ON"
    for ax, (turn, group) in zip(axes, turns.items(), strict=True):
        for s in group:
            cache = s.cell.get("cache")
            _draw_series(ax, s, CACHE_COLORS[cache], f"cache {cache}" if cache else metric)
        if metric == "ttft":  # fitted on the log scale; both arms stay readable
            figures.log_axis(ax, "y")
        ax.set_title(f"turn {turn}", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        _night_axis(ax, nights.labels)
    axes[0].legend(fontsize=7, loc="lower left")
    return fig


def draw_group(nights: Nights, series: list[Series], out_dir: Path) -> list[Path]:
    """The headline figures of one folder and target kind; return the PNG paths."""
    scale = f"-x{nights.time_scale:g}" if nights.time_scale != 1.0 else ""
    folder = out_dir / _safe(f"{nights.folder}-{nights.target_kind}{scale}")
    keyed: dict[tuple[str, str, int], list[Series]] = {}
    for s in series:
        key = (s.metric.name, str(s.cell["placement"]), int(s.cell["context_tokens"]))
        keyed.setdefault(key, []).append(s)
    paths = []
    for (metric, placement, ctx), group in sorted(keyed.items()):
        what = "median TTFT per turn" if metric == "ttft" else "speedup per turn"
        title = (
            f"{nights.folder} [{nights.target_kind}]: {what}, placement {placement}, "
            f"context {ctx} tokens ({len(nights.run_ids)} nights)"
        )
        fig = _headline_figure(nights, metric, title, group)
        paths.append(figures.save(fig, folder / f"{metric}-{_safe(placement)}-{ctx}.png", dpi=110))
    return paths


def trend_plot(
    store: str | Path,
    out_dir: str | Path,
    *,
    window: int | None = WINDOW,
    folders: Collection[str] | None = None,
    **check: Any,
) -> list[Path]:
    """One PNG per headline series with its fitted levels and shifts; return the paths.

    Headline series, per folder, target kind, placement and context size: median TTFT of
    both cache arms per turn (``ttft-...png``) and the speedup per turn (``speedup-...png``).
    ``window`` and ``folders`` as for :func:`trend_check`; ``check`` takes its threshold
    arguments (they decide which shifts are drawn as regressions and improvements).
    """
    paths: list[Path] = []
    groups = check_groups(load_store(store, folders), window=window, **check)
    for nights, series, _counts in groups:
        paths += draw_group(nights, series, Path(out_dir))
    return paths
