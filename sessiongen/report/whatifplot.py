"""The plan report's what-if figure: the pool's gain and median TTFT against the first
varied key (one colour per line, one line style per cache arm).

Apart from :mod:`.whatif` so that a plan whose report has no figure (one configuration)
does not import matplotlib (0.5 s, and more on a busy machine).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

import polars as pl
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from sessiongen.analysis.whatif import Vary, level_name
from sessiongen.report import figures
from sessiongen.report.plots import COLORS, OUTSIDE

#: Line style and marker face per cache arm: the arm reads off the line and off its
#: markers (a dashed line with hollow markers is pool off), at any legend size.
ARM_STYLE: dict[str, tuple[Literal["--", "-"], str | None]] = {
    "off": ("--", "white"),
    "on": ("-", None),
}
#: Marker per series, after the colours run out.
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
#: What a varied key's values are measured in, by the key's ending.
UNITS = (("_gib", "GiB"), ("_tokens", "tokens"), ("_s", "modeled s"))


def _as_number(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def _number(value: object) -> str:
    """A load level or a value as written: integers without decimals."""
    return f"{value:g}"


def axis_label(key: str) -> str:
    """The varied key, with its unit where its name says it (``..._gib``: GiB)."""
    unit = next((u for end, u in UNITS if key.endswith(end)), None)
    return f"{key} ({unit})" if unit else key


def series_label(row: Mapping[str, object], parts: Sequence[str], level: str) -> str:
    """A line's name: the value of each key that tells the lines apart, named
    (``placement alternate, replicas=4, concurrency 8``)."""
    out = []
    for part in parts:
        if part == "placement":
            out.append(str(row["placement"]))
        elif part == "context_tokens":
            out.append(f"context {row['context_tokens']} tokens")
        elif part == "load_level":
            value = _number(row["load_level"])
            out.append(f"concurrency {value}" if level == "concurrency" else f"{value} {level}")
        else:
            out.append(f"{part.rsplit('.', 1)[-1]}={row[part]}")
    return ", ".join(out) or "as given"


def whatif_figure(
    whatif: pl.DataFrame, varies: Sequence[Vary], note: str, *, arrival: str = "closed"
) -> Figure:
    """Pool gain (whole session) and median TTFT against the first varied key: one
    colour per line (a value of every other key that varies: the other varied keys,
    placement, context, load level), one line style per cache arm."""
    x_key = varies[0].key if varies else "label"
    parts = [
        k
        for k in ("placement", *(v.key for v in varies[1:]), "context_tokens", "load_level")
        if whatif[k].n_unique() > 1 and not _set_by(whatif, k, x_key)
    ]
    level = level_name(arrival)
    title = f"What if: the pool's gain and median TTFT against {x_key}"
    if parts:
        title += f"\none line per {', '.join(_part_name(p, level) for p in parts)}"
    fig, (gain, ttft) = figures.panels(title, ncols=2, note=note, margin=(5.2, 1.9))
    fig.subplots_adjust(wspace=0.3, right=0.72)  # room for the right panel's y label, legends
    order = list(dict.fromkeys(whatif[x_key].cast(pl.String).to_list()))
    numeric = _as_number(order)
    series: dict[str, list[dict[str, Any]]] = {}
    for row in whatif.iter_rows(named=True):
        series.setdefault(series_label(row, parts, level), []).append(row)
    lines = []
    for i, (name, rows) in enumerate(series.items()):
        rows.sort(key=lambda r: order.index(str(r[x_key])))
        xs: list[Any] = [str(r[x_key]) for r in rows]
        if numeric is not None:
            xs = [float(x) for x in xs]
        colour = COLORS[i % len(COLORS)]
        marker = MARKERS[(i // len(COLORS)) % len(MARKERS)]
        # a cell without a session gain (no complete session in an arm) is a gap, not 0
        ys = [_or_nan(r["session_gain"]) for r in rows]
        yerr = [
            [_gap(y, r.get("session_gain_low"), below=True) for y, r in zip(ys, rows, strict=True)],
            [
                _gap(y, r.get("session_gain_high"), below=False)
                for y, r in zip(ys, rows, strict=True)
            ],
        ]
        line = gain.errorbar(xs, ys, yerr=yerr, marker=marker, color=colour, label=name, capsize=3)
        lines.append(line)
        shaky = [(x, y) for x, y, r in zip(xs, ys, rows, strict=True) if _unstable(r)]
        if shaky:  # its gain depends on the run's length: ringed, named in the legend
            gain.scatter(*zip(*shaky, strict=True), **UNSTABLE_RING)
        for cache, (style, face) in ARM_STYLE.items():
            ttft.plot(
                xs,
                [_or_nan(r[f"ttft_p50_{cache}_s"]) for r in rows],
                marker=marker,
                markerfacecolor=face or colour,
                color=colour,
                linestyle=style,
            )
    gain.axhline(1.0, color="#888888", linewidth=0.8, linestyle=":")
    if whatif["session_gain"].drop_nulls().drop_nans().is_empty():
        gain.text(0.5, 0.5, "no session gain: no cell ran both arms", ha="center",
                  va="center", transform=gain.transAxes, color="#555555")  # fmt: skip
    if "pays_at" in whatif.columns:
        pays_at = float(whatif["pays_at"][0])
        gain.axhline(pays_at, color="#aa3333", linewidth=0.9, linestyle="-.")
        gain.annotate(f"pays at {pays_at:g}", (0.01, pays_at), xycoords=("axes fraction", "data"),
                      color="#aa3333", fontsize=8, va="bottom")  # fmt: skip
    gain.set_ylabel("session gain (whole-session time OFF / ON, ratio; bars: 95% CI)")
    ttft.set_ylabel("median TTFT (modeled s, log scale)")
    figures.log_axis(ttft, "y")
    for ax in (gain, ttft):
        ax.set_xlabel(axis_label(x_key))
        if numeric is not None and min(numeric) > 0 and max(numeric) / min(numeric) >= 8:
            # limits from the values, not the data: a panel with no point (a one-arm
            # design has no gain) could not be log-scaled from its own
            ax.set_xlim(min(numeric) / 1.25, max(numeric) * 1.25)
            figures.log_axis(ax, "x")  # a range of 8x or more (and --find's geometric steps)
            ax.set_xlabel(f"{axis_label(x_key)}, log scale")
        elif numeric is not None and all(x.is_integer() for x in numeric):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    arms = [
        Line2D([], [], color="#333333", linestyle=style, marker="o",
               markerfacecolor=face or "#333333", label=f"pool {cache}")
        for cache, (style, face) in ARM_STYLE.items()
    ]  # fmt: skip
    if any(_unstable(r) for r in whatif.iter_rows(named=True)):
        arms.append(Line2D([], [], linestyle="none", marker="o", markersize=11,
                           markerfacecolor="none", markeredgecolor=UNSTABLE_RING["edgecolors"],
                           label="unstable: a queue grows"))  # fmt: skip
    right = ttft.legend(handles=arms, title="cache arm", handlelength=3.5, **OUTSIDE)
    ttft.add_artist(right)
    if len(lines) > 1:
        ttft.legend(
            handles=lines,
            title=", ".join(_part_name(p, level) for p in parts) or "configuration",
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.01, 0.62),
        )
    return fig


#: How a gain whose cell has an unstable arm is marked in the figure (a ring around it).
class Ring(TypedDict):
    """Keyword arguments of ``Axes.scatter`` that ring a point."""

    s: int
    facecolors: str
    edgecolors: str
    linewidths: float
    zorder: int
    gid: str


UNSTABLE_RING: Ring = {
    "s": 170, "facecolors": "none", "edgecolors": "#cc2222", "linewidths": 1.4, "zorder": 5,
    "gid": "unstable",
}  # fmt: skip


def _set_by(frame: pl.DataFrame, part: str, x_key: str) -> bool:
    """``part`` is the x key's value under another name (``--find load.levels`` sets the
    cells' ``load_level``): one value per x and one x per value, no line of its own."""
    pairs = frame.select(part, x_key).unique()
    return pairs.height == frame[part].n_unique() == frame[x_key].n_unique()


def _unstable(row: Mapping[str, object]) -> bool:
    return str(row.get("verdict") or "").startswith("unstable")


def _gap(value: float | None, bound: float | None, *, below: bool) -> float:
    """An error bar's length from ``value`` to ``bound`` (0 without either)."""
    if value is None or bound is None or not math.isfinite(value) or not math.isfinite(bound):
        return 0.0
    return max(0.0, value - bound if below else bound - value)


def _part_name(part: str, level: str) -> str:
    return {"context_tokens": "context", "load_level": level}.get(part, part)


def _or_nan(value: float | None) -> float:
    """A figure's point: NaN (a gap in the line) where the table has none."""
    return math.nan if value is None else float(value)
