"""The plan report: ``PLAN_DIR/report/`` with report.md, report.html and the what-if plots.

What a capacity planner reads first: per configuration and placement, the pool's gain
in whole-session time, the typical later turn's gain, TTFT with the pool on and off,
goodput against the scenario's objective, hit rates and queueing; then the gain and
TTFT against the first varied key (one line per placement, and per value of the other
varied keys), and every configuration's run folder for the details. Every figure is
the simulator's, on a virtual clock: the report says so at the top.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sessiongen.capacity.grid import WHATIF_COLUMNS, Config, Vary
from sessiongen.infra.files import atomic_write_bytes, ensure_dir
from sessiongen.report import figures
from sessiongen.report.document import (
    Bullets,
    Element,
    Heading,
    Image,
    Paragraph,
    Table,
    to_html,
    to_markdown,
)
from sessiongen.report.plots import CACHE_STYLE, COLORS, OUTSIDE

#: Marker per value of the varied keys other than the x axis's.
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _as_number(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def _series_key(row: dict[str, Any], others: Sequence[str]) -> str:
    parts = [str(row["placement"])]
    parts += [f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in others]
    if row.get("contexts", 1) > 1:
        parts.append(f"{row['context_tokens']} tok")
    if row.get("levels", 1) > 1:
        parts.append(f"@ {row['load_level']:g}")
    return ", ".join(parts)


def whatif_figure(whatif: pl.DataFrame, varies: Sequence[Vary], note: str) -> Figure:
    """Pool gain (whole session) and median TTFT against the first varied key."""
    fig, (gain, ttft) = figures.panels("What if: the pool's gain and TTFT", ncols=2, note=note)
    fig.subplots_adjust(wspace=0.3)  # room for the right panel's own y label
    x_key = varies[0].key if varies else "label"
    others = [v.key for v in varies[1:]]
    order = list(dict.fromkeys(whatif[x_key].cast(pl.String).to_list()))
    numeric = _as_number(order)
    frame = whatif.with_columns(
        pl.col("context_tokens").n_unique().alias("contexts"),
        pl.col("load_level").n_unique().alias("levels"),
    )
    series: dict[str, list[dict[str, Any]]] = {}
    marks: dict[str, str] = {}
    for row in frame.iter_rows(named=True):
        series.setdefault(_series_key(row, others), []).append(row)
        rest = _series_key({**row, "placement": ""}, others)
        marks.setdefault(rest, MARKERS[len(marks) % len(MARKERS)])
    placements = sorted(whatif["placement"].unique().to_list())
    for name, rows in series.items():
        rows.sort(key=lambda r: order.index(str(r[x_key])))
        xs: list[Any] = [str(r[x_key]) for r in rows]
        if numeric is not None:
            xs = [float(x) for x in xs]
        colour = COLORS[placements.index(rows[0]["placement"]) % len(COLORS)]
        marker = marks[_series_key({**rows[0], "placement": ""}, others)]
        gain.plot(xs, [r["session_gain"] for r in rows], marker=marker, color=colour, label=name)
        for cache in ("off", "on"):
            ttft.plot(
                xs,
                [r[f"ttft_p50_{cache}_s"] for r in rows],
                marker=marker,
                color=colour,
                linestyle=CACHE_STYLE[cache],
                label=f"{name}, pool {cache}",
            )
    gain.axhline(1.0, color="#888888", linewidth=0.8, linestyle=":")
    gain.set_ylabel("session gain (whole-session time OFF / ON)")
    ttft.set_ylabel("median TTFT (modeled s, log)")
    figures.log_axis(ttft, "y")
    for ax in (gain, ttft):
        ax.set_xlabel(x_key)
        if numeric is not None and all(x.is_integer() for x in numeric):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if series:
        ttft.legend(**OUTSIDE)
    return fig


def _table(whatif: pl.DataFrame, varies: Sequence[Vary]) -> pl.DataFrame:
    keep = [
        "config",
        *(v.key for v in varies),
        "placement",
        "context_tokens",
        "load_level",
        "session_gain",
        "ttft_sum_gain",
        "later_turn_gain",
        "ttft_p50_off_s",
        "ttft_p50_on_s",
        "ttft_p90_on_s",
        "good_turns_off",
        "good_turns_on",
        "local_hit_rate_on",
        "pool_hit_rate_on",
        "queue_p90_on_s",
    ]
    frame = whatif.select([c for c in keep if c in whatif.columns])
    if frame["good_turns_on"].null_count() == frame.height:
        frame = frame.drop("good_turns_off", "good_turns_on")
    return frame


def write_whatif_report(
    out: Path,
    whatif: pl.DataFrame,
    turns: pl.DataFrame,
    grid: Sequence[Config],
    varies: Sequence[Vary],
) -> Path:
    """Write ``out/report/``; return the report.md path."""
    report = ensure_dir(out / "report")
    first = grid[0].scenario
    given = first.target.sim.profile
    profile = given or "the built-in study profile (calibration table, sessiongen.scenario)"
    note = (
        f"PLANNED (virtual clock, not measured): {first.name}, "
        f"profile {Path(given).name if given else 'built-in (study)'}"
    )
    blocks: list[Element] = [
        Heading(f"sessiongen plan: {first.name}", 1),
        Paragraph(
            "PLANNED: every figure below is the simulator's, run on a virtual clock "
            "(no server, no wall time), for one seeded arrival sequence. Nothing is measured; "
            "the simulator is only as right as its profile.",
            warning=True,
        ),
        Paragraph(
            f"Scenario {first.source} (digest {first.digest()}); profile: {profile}; "
            f"{len(grid)} configurations"
            + (f", varying {', '.join(v.key for v in varies)}." if varies else ".")
        ),
        Heading("What if"),
        Table(_table(whatif, varies), max_rows=200),
    ]
    if len(grid) > 1:
        png, _svg = figures.save_png_svg(whatif_figure(whatif, varies, note), report, "whatif")
        blocks.append(Image(png, "pool gain and median TTFT against the varied key"))
    blocks += [
        Heading("Columns"),
        Bullets(tuple(f"{k}: {v}" for k, v in WHATIF_COLUMNS.items())),
        Heading("Per turn"),
        Table(turns.drop("label"), max_rows=200),
        Heading("Configurations"),
        Bullets(
            tuple(
                f"{c.index}: {c.label} -> configs/{c.folder} (sessiongen report configs/{c.folder})"
                for c in grid
            )
        ),
    ]
    path = report / "report.md"
    atomic_write_bytes(path, to_markdown(blocks, report).encode())
    atomic_write_bytes(report / "report.html", to_html(blocks, f"plan {first.name}").encode())
    return path
