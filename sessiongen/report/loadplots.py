"""Figures of a run under load: saturation curves and goodput against offered load.

Built on the shared scaffolding (:mod:`sessiongen.report.figures`); one line per arm
(placement: colour, cache: line style), offered load on the x axis (concurrency or
session start rate).
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sessiongen.analysis.frames import partition
from sessiongen.report import figures
from sessiongen.report.plots import CACHE_STYLE, COLORS, OUTSIDE

#: The load tables' arm keys besides the level.
ARM = ["placement", "cache", "context_tokens"]


def _line(ax: Axes, placements: list[str], key: Mapping[str, object], x: pl.Series,
          y: pl.Series,
          *, label: bool = True) -> None:  # fmt: skip
    ax.plot(
        x.to_list(),
        y.to_list(),
        color=COLORS[placements.index(str(key["placement"])) % len(COLORS)],
        linestyle=CACHE_STYLE.get(str(key["cache"]), "-"),
        marker="o",
        label=f"{key['placement']}, cache {key['cache']}" if label else None,
    )


def saturation_figure(table: pl.DataFrame, note: str, level_name: str, unit: str) -> Figure:
    """TTFT p50 and the p90 early-stopping estimate per arm against offered load."""
    fig, (p50, p90) = figures.panels("TTFT against offered load", ncols=2, note=note, sharey=True)
    placements = sorted(table["placement"].unique().to_list())
    for key, sub in partition(table.sort("load_level"), ARM):
        _line(p50, placements, key, sub["load_level"], sub["p50_ttft_s"])
        _line(p90, placements, key, sub["load_level"], sub["p90_ttft_s"], label=False)
    for ax, what in ((p50, "p50"), (p90, "p90 (early-stopping estimate; gaps: too few)")):
        ax.set_xlabel(level_name)
        ax.set_title(what, fontsize=9)
        figures.log_axis(ax, "y")
    p50.set_ylabel(f"TTFT ({unit}, log)")
    if not table.is_empty():
        p50.legend(**OUTSIDE)
    return fig


def goodput_figure(
    table: pl.DataFrame, note: str, level_name: str, ttft_s: float, attainment: float
) -> Figure:
    """Share of turns within the TTFT objective per arm against load, with the target."""
    title = f"Goodput: turns with TTFT <= {ttft_s:g}"
    fig, (ax,) = figures.panels(title, note=note)
    placements = sorted(table["placement"].unique().to_list())
    for key, sub in partition(table.sort("load_level"), ARM):
        _line(ax, placements, key, sub["load_level"], sub["good_turns"])
        colour = COLORS[placements.index(str(key["placement"])) % len(COLORS)]
        ax.fill_between(
            sub["load_level"].to_list(),
            sub["good_turns_low"].to_list(),
            sub["good_turns_high"].to_list(),
            color=colour,
            alpha=0.12,
        )
    ax.axhline(attainment, color="#888888", linewidth=0.8, linestyle=":")
    ax.set_xlabel(level_name)
    ax.set_ylabel("share of turns within the objective (band: Wilson 95%)")
    ax.set_ylim(0, 1.02)
    if not table.is_empty():
        ax.legend(**OUTSIDE)
    return fig
