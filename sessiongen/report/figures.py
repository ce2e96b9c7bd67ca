"""Figure scaffolding shared by every plot: Agg canvas, panel grid, caption, atomic save.

Figures are built without pyplot, so no global backend state is touched (safe in
threads, notebooks and servers); a notebook shows them with ``display(fig)``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter, LogFormatter

from sessiongen.infra.files import atomic_write_bytes, ensure_dir

#: Metadata that would make every render differ (timestamps, versions) is left out.
_STABLE = {"png": {"Software": None}, "svg": {"Date": None}}


def panels(
    title: str,
    *,
    nrows: int = 1,
    ncols: int = 1,
    panel_size: tuple[float, float] = (4.2, 3.4),
    margin: tuple[float, float] = (3.2, 1.6),
    note: str = "",
    sharey: bool = False,
    constrained: bool = False,
) -> tuple[Figure, list[Axes]]:
    """A figure of ``nrows`` x ``ncols`` panels with a title and an optional caption.

    Sizes are in inches: each panel ``panel_size`` plus ``margin`` for the whole figure.
    The caption (``note``) sits in the bottom-left corner; margins are fixed in inches
    so title and caption keep their room at any height. Returns the axes row by row.
    """
    width = panel_size[0] * ncols + margin[0]
    height = panel_size[1] * nrows + margin[1]
    fig = Figure(figsize=(width, height), layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    grid = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    fig.suptitle(title, fontsize=12 if note else 11)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#444444", ha="left", va="bottom")
    if not constrained:
        fig.subplots_adjust(
            left=0.1,
            right=0.97,
            top=1 - 0.7 / height,
            bottom=1.0 / height,
            wspace=0.08,
            hspace=0.35,
        )
    return fig, [ax for row in grid for ax in row]


def plain_number(value: float) -> str:
    """``value`` to three significant digits, written out: ``6``, ``0.2``, ``1500``."""
    return str(np.format_float_positional(float(f"{value:.3g}"), trim="-"))


class _PlainLogFormatter(Formatter):
    """Log-axis tick labels as plain numbers with a unit (``6x``, ``0.2``), never
    ``6x10^0``; which ticks get a label is matplotlib's own choice (every decade, and
    the minor ticks between when the axis spans about a decade or less)."""

    def __init__(self, *, minor: bool, suffix: str) -> None:
        self._choose = LogFormatter(labelOnlyBase=not minor, minor_thresholds=(2, 0.5))
        self._suffix = suffix

    def set_axis(self, axis: Any) -> None:
        super().set_axis(axis)
        self._choose.set_axis(axis)

    def set_locs(self, locs: Any) -> None:
        super().set_locs(locs)
        self._choose.set_locs(locs)

    def __call__(self, x: float, pos: int | None = None) -> str:
        if x <= 0 or not self._choose(x, pos):
            return ""
        return plain_number(x) + self._suffix


def log_axis(ax: Axes, which: Literal["x", "y"] = "y", *, suffix: str = "") -> None:
    """Put one axis of ``ax`` on a log scale with plain tick labels (``suffix`` after
    each, e.g. ``"x"`` for speedups). Every log axis of every figure goes through here."""
    axis: Axis
    if which == "x":
        ax.set_xscale("log")
        axis = ax.xaxis
    else:
        ax.set_yscale("log")
        axis = ax.yaxis
    axis.set_major_formatter(_PlainLogFormatter(minor=False, suffix=suffix))
    axis.set_minor_formatter(_PlainLogFormatter(minor=True, suffix=suffix))


def save(fig: Figure, path: Path, *, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: png or svg), atomically."""
    fmt = path.suffix.lstrip(".")
    ensure_dir(path.parent)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight", metadata=_STABLE.get(fmt, {}))
    atomic_write_bytes(path, buf.getvalue())
    return path


def save_png_svg(fig: Figure, out_dir: Path, stem: str) -> tuple[Path, Path]:
    """Write ``stem.png`` and ``stem.svg``; return both paths."""
    return save(fig, out_dir / f"{stem}.png"), save(fig, out_dir / f"{stem}.svg")
