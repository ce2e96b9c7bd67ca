"""Figures of a run: speedup curves (the headline), median TTFT, TTFT CDFs, cache attribution.

Each ``*_figure`` function takes the polars frame that :mod:`sessiongen.analysis` computes
and a caption (:func:`caption`: scenario, target with SIMULATED for simulated runs, run
id and date), and returns a :class:`matplotlib.figure.Figure` built on the shared
scaffolding (:mod:`sessiongen.report.figures`). :func:`write_figures` writes PNG and SVG
atomically. Times are modeled seconds for simulated runs (measured seconds divided by
the time scale) and measured seconds for real ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sessiongen.records.run import Run
from sessiongen.report import figures
from sessiongen.report.figures import save_png_svg

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")
CACHE_STYLE = {"off": "--", "on": "-"}
FIGURE_NAMES = ("speedup", "median_ttft", "ttft_cdf", "cache_attribution")


class LegendPlace(TypedDict):
    """Keyword arguments of ``Axes.legend`` that say where it goes and how large."""

    fontsize: int
    loc: Literal["upper left"]
    bbox_to_anchor: tuple[float, float]


#: Legends sit right of the axes so they never hide data (saving uses a tight bbox).
OUTSIDE: LegendPlace = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}


def caption(run: Run) -> str:
    """The caption every figure carries: scenario, target, run id and date."""
    date = run.meta.date or "date unknown"
    return (
        f"scenario {run.scenario_name} | target {run.target_label} | "
        f"run {run.run_id} | {date} | times in {run.seconds}"
    )


def _figure(title: str, note: str, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list[Axes]]:
    return figures.panels(title, nrows=nrows, ncols=ncols, note=note, sharey=True)


def _empty(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#666666")


@dataclass(frozen=True)
class Line:
    """What one plotted line is of: a placement and context (and arm, where split by it)."""

    placement: str
    context_tokens: int
    cache: str | None = None

    @property
    def style(self) -> str:
        return CACHE_STYLE.get(self.cache or "", "-")


def _series(frame: pl.DataFrame, keys: list[str]) -> Iterator[tuple[Line, pl.DataFrame]]:
    """Sub-frames per key combination (placement, context, cache where among ``keys``),
    sorted, each sorted by turn (if present)."""
    if frame.is_empty():
        return
    for key, sub in sorted(frame.partition_by(keys, as_dict=True).items(), key=str):
        order = "turn" if "turn" in sub.columns else sub.columns[0]
        named = dict(zip(keys, key, strict=True))
        cache = named.get("cache")
        line = Line(
            placement=str(named["placement"]),
            context_tokens=int(named["context_tokens"]),
            cache=None if cache is None else str(cache),
        )
        yield line, sub.sort(order)


def _label(key: Line, multi_ctx: bool) -> str:
    parts = [key.placement]
    if key.cache is not None:
        parts.append(f"cache {key.cache}")
    if multi_ctx:
        parts.append(f"{key.context_tokens // 1024}k context")
    return ", ".join(parts)


def _color(placements: list[str], placement: str) -> str:
    return COLORS[placements.index(placement) % len(COLORS)]


def _multi(frame: pl.DataFrame) -> bool:
    return "context_tokens" in frame.columns and frame["context_tokens"].n_unique() > 1


def speedup_figure(speedups: pl.DataFrame, note: str) -> Figure:
    """Per-turn ON/OFF speedup of median TTFT, one line per placement, with CI bands."""
    fig, (ax,) = _figure("Shared-cache speedup per turn (median TTFT off / on)", note)
    data = speedups.filter(pl.col("speedup").is_not_null())
    placements = sorted(data["placement"].unique().to_list())
    multi = _multi(data)
    styles = ["-", "--", ":", "-."]
    contexts = sorted(data["context_tokens"].unique().to_list()) if not data.is_empty() else []
    for key, sub in _series(data, ["placement", "context_tokens"]):
        color = _color(placements, key.placement)
        style = styles[contexts.index(key.context_tokens) % len(styles)]
        turns = sub["turn"].to_numpy()
        ax.plot(
            turns,
            sub["speedup"].to_numpy(),
            style,
            marker="o",
            color=color,
            label=_label(key, multi),
        )
        ax.fill_between(
            turns,
            sub["speedup_ci_low"].to_numpy(),
            sub["speedup_ci_high"].to_numpy(),
            color=color,
            alpha=0.18,
        )
    if data.is_empty():
        _empty(ax, "no speedup: the run lacks an OFF or an ON arm")
    ax.axhline(1.0, color="#888888", linewidth=0.8, linestyle=":")
    ax.set_xlabel("turn")
    ax.set_ylabel("speedup (x; band: bootstrap CI)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not data.is_empty():
        # Cross-replica turns can gain 30x while the rest gain 1.1x: a log axis shows both.
        high = float(data.select(pl.col("speedup_ci_high").fill_null(1.0).max()).item())
        low = float(data.select(pl.col("speedup_ci_low").fill_null(1.0).min()).item())
        if high / max(low, 1e-9) > 8:
            figures.log_axis(ax, "y", suffix="x")
        ax.legend(title="placement", **OUTSIDE)
    return fig


def median_ttft_figure(arm_table: pl.DataFrame, note: str, unit: str = "modeled s") -> Figure:
    """Median TTFT per turn per arm with CI error bars, log axis."""
    fig, (ax,) = _figure("Median time to first token per turn", note)
    data = arm_table.filter(pl.col("median_ttft_s").is_not_null())
    placements = sorted(data["placement"].unique().to_list())
    multi = _multi(data)
    for key, sub in _series(data, ["placement", "cache", "context_tokens"]):
        med = sub["median_ttft_s"].to_numpy()
        err = np.vstack([med - sub["ci_low_s"].to_numpy(), sub["ci_high_s"].to_numpy() - med])
        ax.errorbar(
            sub["turn"].to_numpy(),
            med,
            yerr=np.clip(err, 0, None),
            capsize=3,
            linestyle=key.style,
            marker="o",
            color=_color(placements, key.placement),
            label=_label(key, multi),
        )
    if data.is_empty():
        _empty(ax, "no successful requests")
    else:
        figures.log_axis(ax, "y")
        ax.legend(title="arm", **OUTSIDE)
    ax.set_xlabel("turn")
    ax.set_ylabel(f"median TTFT ({unit}, log scale)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def ttft_cdf_figure(requests: pl.DataFrame, note: str, unit: str = "modeled s") -> Figure:
    """Empirical CDF of TTFT per arm over all turns (ok rows), log axis."""
    fig, (ax,) = _figure("TTFT distribution per arm (all turns)", note)
    data = requests.filter(pl.col("status") == "ok", pl.col("ttft_s") > 0)
    placements = sorted(data["placement"].unique().to_list())
    multi = _multi(data)
    for key, sub in _series(data, ["placement", "cache", "context_tokens"]):
        values = np.sort(sub["ttft_s"].to_numpy())
        frac = np.arange(1, values.size + 1) / values.size
        ax.step(
            values,
            frac,
            where="post",
            linestyle=key.style,
            color=_color(placements, key.placement),
            label=_label(key, multi),
        )
    if data.is_empty():
        _empty(ax, "no successful requests")
    else:
        figures.log_axis(ax, "x")
        ax.legend(title="arm", **OUTSIDE)
    ax.set_xlabel(f"TTFT ({unit}, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    return fig


def _token_parts(attribution: pl.DataFrame) -> pl.DataFrame:
    """Split mean prompt tokens into local, external, cached-unattributed and uncached.

    Per-request counter deltas are only attributable at concurrency 1; otherwise the
    server's ``cached_tokens`` still says how much hit, just not where.
    """
    hits = pl.col("local_hit_tokens").fill_null(0) + pl.col("external_hit_tokens").fill_null(0)
    cached = pl.max_horizontal(pl.col("cached_tokens").fill_null(0), hits)
    return attribution.with_columns(
        unattributed=(cached - hits).clip(lower_bound=0),
        uncached=(pl.col("prompt_tokens") - cached).clip(lower_bound=0),
    )


def cache_attribution_figure(attribution: pl.DataFrame, note: str) -> Figure:
    """Mean local-hit, external-hit and uncached prompt tokens per request, per turn."""
    placements = sorted(attribution["placement"].unique().to_list()) or ["-"]
    contexts = sorted(attribution["context_tokens"].unique().to_list()) or [0]
    fig, axes = _figure(
        "Where prompt tokens came from, per turn and arm",
        note,
        ncols=len(placements),
        nrows=len(contexts),
    )
    parts = (
        ("local_hit_tokens", "local hit", "#2ca02c"),
        ("external_hit_tokens", "external (shared pool) hit", "#1f77b4"),
        ("unattributed", "cached, source not attributed", "#9edae5"),
        ("uncached", "not cached (prefilled)", "#cccccc"),
    )
    data = _token_parts(attribution)
    for i, (ctx, placement) in enumerate((c, p) for c in contexts for p in placements):
        ax = axes[i]
        ax.set_title(
            placement + (f", {ctx // 1024}k context" if len(contexts) > 1 else ""), fontsize=10
        )
        for offset, cache, hatch in ((-0.2, "off", "//"), (0.2, "on", "")):
            sub = data.filter(
                pl.col("placement") == placement,
                pl.col("context_tokens") == ctx,
                pl.col("cache") == cache,
            ).sort("turn")
            bottom = np.zeros(sub.height)
            for column, label, color in parts:
                values = sub[column].fill_null(0).to_numpy() / 1000
                ax.bar(
                    sub["turn"].to_numpy() + offset,
                    values,
                    width=0.38,
                    bottom=bottom,
                    color=color,
                    hatch=hatch,
                    edgecolor="white",
                    linewidth=0.5,
                    label=label if (i, cache) == (len(axes) - 1, "on") else None,
                )
                bottom += values
        ax.set_xlabel("turn (left bar: cache off, hatched; right: on)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("tokens per request (thousands)")
    if attribution.is_empty():
        _empty(axes[0], "no requests")
    else:
        axes[-1].legend(**OUTSIDE)
    return fig


def write_figures(
    run: Run,
    out_dir: Path,
    *,
    speedups: pl.DataFrame,
    arm_table: pl.DataFrame,
    attribution: pl.DataFrame,
) -> dict[str, Path]:
    """Draw and save the four report figures; return their PNG paths by name."""
    note = caption(run)
    unit = "modeled s" if run.modeled else "s"
    drawn = {
        "speedup": speedup_figure(speedups, note),
        "median_ttft": median_ttft_figure(arm_table, note, unit),
        "ttft_cdf": ttft_cdf_figure(run.requests, note, unit),
        "cache_attribution": cache_attribution_figure(attribution, note),
    }
    return {name: save_png_svg(fig, out_dir, name)[0] for name, fig in drawn.items()}
