"""The plan report's sensitivity section: each decision cell's verdict over the profile's
box, and a tornado chart per cell.

``PLAN/sensitivity.parquet`` (written by :mod:`sessiongen.capacity.sensitivity`) holds,
per cell and profile parameter, the session gain and verdict at the parameter's low and
high end. A tornado chart draws them per cell: one row per parameter, sorted by swing
(the largest at the top), a bar from the cell's gain to the gain at each end (low end
and high end one colour each, hatched where an arm turns unstable there, the verdict
written beside an end that flips the cell's), a vertical line at the cell's gain and
one at ``pays_at``. Built on the shared scaffolding (:mod:`sessiongen.report.figures`);
read from the file, so the report stage does not import the planner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from sessiongen.report import figures
from sessiongen.report.document import Element, Heading, Image, Paragraph, Table
from sessiongen.report.plots import COLORS, OUTSIDE

#: The plan folder's file of the ends (:mod:`sessiongen.capacity.sensitivity`).
FILE = "sensitivity.parquet"
#: Panels per figure: a larger grid is drawn over several figures.
PANELS = 8
#: Colour per end of a parameter's box.
END_COLOURS = {"low": COLORS[0], "high": COLORS[4]}
#: How an end where an arm turns unstable is marked (its queue grows with the run).
UNSTABLE_HATCH = "///"
#: The cell keys of a what-if row besides the varied keys.
CELL = ["config", "placement", "context_tokens", "load_level"]

METHOD = (
    "Each profile parameter is moved alone to the low and the high end of its box (the "
    "fitted interval a profile written by sessiongen fit carries in [fit.interval]; "
    "-/+10% of its value where it has none), the others at the profile's values, and "
    "each end planned once with the scenario's seed. An end's gain and interval are the "
    "cell's times the end's gain over replicate 0's (the same seed, so the ratio is the "
    "parameter's doing), and its verdict is read exactly as the cell's. A cell is robust "
    "when every end gives its verdict; otherwise the text names the parameter, the "
    "direction and the verdict there, and an arm that turns unstable at an end makes the "
    "cell near saturation. Parameters at zero and varied keys are not moved. Every end's "
    "figures are in sensitivity.parquet and its run under sensitivity/."
)


def cell_title(row: Mapping[str, object], varies: Sequence[str], *, trace: bool = False) -> str:
    """A panel's title: the varied values, placement, and (not for a trace, which has
    neither) context and level."""
    parts = [f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in varies]
    parts.append(str(row["placement"]))
    if not trace and row.get("context_tokens") is not None:
        parts.append(f"context {row['context_tokens']}")
    if not trace and row.get("load_level") is not None:
        parts.append(f"level {row['load_level']:g}")
    return ", ".join(parts)


@dataclass(frozen=True)
class End:
    """One end of a parameter's box in a cell: the gain there and what it changes."""

    gain: float  # the session gain at the end (NaN: unknown)
    change: float | None  # against the cell's gain
    verdict: str
    flips: bool  # the verdict differs from the cell's


@dataclass(frozen=True)
class Swing:
    """A parameter's two ends in a cell (None: that end was not planned)."""

    parameter: str
    low: End | None
    high: End | None

    @property
    def ends(self) -> list[End]:
        return [e for e in (self.low, self.high) if e is not None]


def _ends(frame: pl.DataFrame) -> list[Swing]:
    """One row per parameter (low and high end side by side), largest swing first."""
    by: dict[str, dict[str, End]] = {}
    for r in frame.iter_rows(named=True):
        end = End(
            gain=_num(r["session_gain"]),
            change=r["change"],
            verdict=str(r["verdict"]),
            flips=bool(r["flips"]),
        )
        by.setdefault(str(r["parameter"]), {})[str(r["end"])] = end
    rows = [Swing(parameter=p, low=e.get("low"), high=e.get("high")) for p, e in by.items()]
    return sorted(rows, key=_swing, reverse=True)


def _swing(row: Swing) -> float:
    """How far apart a parameter's two ends put the gain (0 without both)."""
    gains = [e.gain for e in row.ends if math.isfinite(e.gain)]
    return max(gains) - min(gains) if len(gains) == 2 else 0.0


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _percent(end: End | None) -> str:
    if end is None or end.change is None or not math.isfinite(end.change):
        return "?"
    return f"{end.change * 100:+.3g}%"


def draw_cell(ax: Axes, base: float | None, pays_at: float, frame: pl.DataFrame) -> None:
    """One cell's tornado on ``ax`` (module doc); ``frame`` is its ends."""
    rows = _ends(frame)
    centre = _num(base)
    labels = []
    for y, row in enumerate(reversed(rows)):  # the largest swing at the top
        low, high = row.low, row.high
        labels.append(f"{row.parameter} ({_percent(low)} / {_percent(high)})")
        for name, end in (("low", low), ("high", high)):
            if end is None:
                continue
            gain = end.gain
            if not (math.isfinite(gain) and math.isfinite(centre)):
                continue
            unstable = end.verdict.startswith("unstable")
            ax.barh(
                y,
                gain - centre,
                left=centre,
                height=0.7,
                color=END_COLOURS[name],
                alpha=0.8,
                hatch=UNSTABLE_HATCH if unstable else None,
                edgecolor="#cc2222" if unstable else END_COLOURS[name],
            )
            if end.flips:
                ax.annotate(
                    end.verdict,
                    (gain, y),
                    xytext=(3 if gain >= centre else -3, 0),
                    textcoords="offset points",
                    ha="left" if gain >= centre else "right",
                    va="center",
                    fontsize=7,
                    color="#aa3333",
                )
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(-0.7, max(len(labels), 1) - 0.3)
    if math.isfinite(centre):
        ax.axvline(centre, color="#222222", linewidth=1.0)
    ax.axvline(pays_at, color="#aa3333", linewidth=0.9, linestyle="-.")
    ax.set_xlabel("session gain (OFF / ON) at the end")
    seen = [centre, pays_at] + [e.gain for row in rows for e in row.ends]
    seen = [x for x in seen if math.isfinite(x)]
    pad = 0.06 * (max(seen) - min(seen)) or 0.02 * max(seen)  # both lines off the frame
    ax.set_xlim(min(seen) - pad, max(seen) + pad)
    still = not rows or all(_swing(r) <= 1e-9 * max(abs(centre), 1.0) for r in rows)
    if still:
        ax.text(0.5, 0.5, "no parameter moved" if not rows else "no end moves the gain",
                ha="center", va="center", transform=ax.transAxes, color="#555555")  # fmt: skip


def tornado_figure(
    cells: Sequence[tuple[str, float | None, pl.DataFrame]], pays_at: float, note: str
) -> Figure:
    """Tornado charts of ``cells`` (title, the cell's gain, its ends), one panel each."""
    ncols = 1 if len(cells) == 1 else 2
    nrows = -(-len(cells) // ncols)
    tallest = max((frame["parameter"].n_unique() for _t, _b, frame in cells), default=1)
    fig, axes = figures.panels(
        "Sensitivity: the session gain at each profile parameter's low and high end",
        nrows=nrows,
        ncols=ncols,
        panel_size=(5.6, 0.34 * tallest + 1.2),
        margin=(2.8, 1.6),
        constrained=True,
    )
    # the caption as a figure label, so the constrained layout keeps it off the axes
    fig.supxlabel(note, x=0.01, ha="left", fontsize=7, color="#444444")
    for ax, (title, base, frame) in zip(axes, cells, strict=False):
        draw_cell(ax, base, pays_at, frame)
        ax.set_title(title, fontsize=9)
    for ax in axes[len(cells) :]:
        ax.set_visible(False)
    handles = [
        Patch(color=END_COLOURS["low"], label="low end"),
        Patch(color=END_COLOURS["high"], label="high end"),
        Patch(facecolor="white", edgecolor="#cc2222", hatch=UNSTABLE_HATCH,
              label="an arm unstable there"),
        Line2D([], [], color="#222222", linewidth=1.0, label="the cell's gain"),
        Line2D([], [], color="#aa3333", linewidth=0.9, linestyle="-.",
               label=f"pays at {pays_at:g}"),
    ]  # fmt: skip
    axes[ncols - 1].legend(handles=handles, **OUTSIDE)
    return fig


def sensitivity_section(
    out: Path,
    report: Path,
    whatif: pl.DataFrame,
    varies: Sequence[str],
    note: str,
    *,
    trace: bool = False,
) -> list[Element]:
    """The report's sensitivity section (module doc), or nothing for a plan without
    ``sensitivity.parquet`` (``--no-sensitivity``, ``--find``); ``whatif`` as the report
    prints it (whole levels), ``varies`` the varied keys, ``trace`` for a trace's plan."""
    path = out / FILE
    if not path.is_file() or "robustness" not in whatif.columns:
        return []
    ends = pl.read_parquet(path)
    shown = ["placement"] if trace else CELL[1:]  # a trace's cells have no level, context
    table = whatif.select(
        "config", *varies, *shown, "session_gain", "verdict", "robustness", "sensitive_to"
    )
    blocks: list[Element] = [
        Heading("Sensitivity: does the verdict hold over the profile's box?"),
        Paragraph(METHOD),
        Table(table, max_rows=200),
    ]
    if ends.is_empty():
        return blocks
    pays_at = float(whatif["pays_at"][0])
    cells = []
    for row in whatif.iter_rows(named=True):
        mine = ends.filter(
            *(
                pl.col(k).is_null() if row[k] is None else pl.col(k) == row[k]
                for k in CELL
                if k in ends.columns
            )
        )
        cells.append((cell_title(row, varies, trace=trace), row["session_gain"], mine))
    for i in range(0, len(cells), PANELS):
        part = cells[i : i + PANELS]
        stem = "tornado" if len(cells) <= PANELS else f"tornado-{i // PANELS + 1}"
        png, _svg = figures.save_png_svg(tornado_figure(part, pays_at, note), report, stem)
        blocks.append(Image(png, f"tornado charts of cells {i + 1} to {i + len(part)}"))
    return blocks
