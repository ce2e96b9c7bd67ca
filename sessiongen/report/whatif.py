"""The plan report: ``PLAN_DIR/report/`` with report.md, report.html and the what-if plots.

What a capacity planner reads first: the decision table (per configuration and arm, the
pool's gain in whole-session time and in later turns' TTFT, goodput against the
scenario's objective, each with its 95% interval, and the verdict against
``--pays-at``), a ``--find`` bracket when there is one; then the what-if figures per
configuration and placement (TTFT with the pool on and off, hit rates, queueing); the gain and
TTFT against the first varied key (one colour per line, a line per value of whatever
else varies: the other varied keys, placement, context, load level, each named in the
legend; one line style per cache arm), what each column of the table means (listed
from the table itself), and every configuration's ``sessiongen report`` command with
a path that works where ``plan`` ran. Every figure is the simulator's, on a virtual
clock: the report says so at the top.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict

import polars as pl
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from sessiongen.analysis.load import MAX_GROWTH, MIN_SERVED_SHARE
from sessiongen.analysis.whatif import (
    Config,
    Vary,
    describe_columns,
    gain_name,
    level_name,
    trace_cells,
)
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
from sessiongen.report.plots import COLORS, OUTSIDE
from sessiongen.report.tornado import sensitivity_section

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


def _table(whatif: pl.DataFrame, varies: Sequence[Vary]) -> pl.DataFrame:
    keep = [
        "config",
        *(v.key for v in varies),
        "placement",
        "context_tokens",
        "load_level",
        "session_gain",
        "session_gain_low",
        "session_gain_high",
        "session_gain_seed_min",
        "session_gain_seed_max",
        "ttft_sum_gain",
        "later_gain",
        "later_turn_gain",
        "ttft_p50_off_s",
        "ttft_p50_on_s",
        "ttft_p90_on_s",
        "good_turns_off",
        "good_turns_on",
        "local_hit_rate_on",
        "pool_hit_rate_on",
        "queue_p90_on_s",
        "in_flight_p50_off",
        "in_flight_p50_on",
        "stable_off",
        "stable_on",
        "verdict",
    ]
    frame = whatif.select([c for c in keep if c in whatif.columns])
    if frame["good_turns_on"].null_count() == frame.height:
        frame = frame.drop("good_turns_off", "good_turns_on")
    return whole_levels(frame)


def _with_interval(value: Any, low: Any, high: Any) -> str:
    if value is None:
        return "-"
    if low is None or high is None:
        return f"{value:.2f} [-]"
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def decision_table(whatif: pl.DataFrame, varies: Sequence[Vary]) -> pl.DataFrame:
    """The decision: per configuration and arm, the gains and goodput with their 95%
    intervals as text, and the verdict against the row's ``pays_at``; the gains of a
    cell with an unstable arm marked :data:`UNSTABLE_MARK` (they depend on the run's
    length)."""
    rows = []
    goodput = "good_turns_on" in whatif.columns and whatif["good_turns_on"].null_count() < len(
        whatif
    )
    for r in whole_levels(whatif).iter_rows(named=True):
        row = {v.key: r[v.key] for v in varies}
        row.update(placement=r["placement"], context_tokens=r["context_tokens"],
                   load_level=r["load_level"])  # fmt: skip
        mark = UNSTABLE_MARK if str(r["verdict"]).startswith("unstable") else ""
        row["session gain [95% CI]"] = (
            _with_interval(r["session_gain"], r["session_gain_low"], r["session_gain_high"]) + mark
        )
        row["later-turn gain [95% CI]"] = (
            _with_interval(r["later_gain"], r["later_gain_low"], r["later_gain_high"]) + mark
        )
        if goodput:  # each arm's goodput, then whether it meets the objective
            for arm in ("off", "on"):
                row[f"goodput {arm} [95% CI]"] = _with_interval(
                    r[f"good_turns_{arm}"], r.get(f"good_turns_{arm}_low"),
                    r.get(f"good_turns_{arm}_high"),
                ) + (f" {r[f'objective_{arm}']}" if r.get(f"objective_{arm}") else "")  # fmt: skip
        row["sessions"] = r["sessions"]
        row["verdict"] = r.get("verdict_text") or r["verdict"]
        rows.append(row)
    return pl.DataFrame(rows)


#: Appended to a gain that depends on the run's length (a cell with an unstable arm).
UNSTABLE_MARK = " (unstable)"

DECISION_METHOD = (
    "Gains are OFF / ON ratios of medians (whole-session time; TTFT of turns 2..). Their "
    "95% intervals combine, in variance on the log scale, the sampling of the distinct "
    "replicates' units pooled (a paired bootstrap, expanded percentile, Hesterberg 2015, "
    "2,000 resamples; the unit a session, or for a trace a block of consecutive requests), "
    "the profile's parameter draws (a predictive interval over replicates) and the model's "
    "own error per regime, and hold every replicate's own gain; below 5 units the verdict "
    "is 'not enough data'. Goodput's interval is Clopper-Pearson on the sessions' "
    "effective sample size, and an arm "
    "meets the objective when that interval lies wholly at or above its attainment, misses "
    "it when wholly below or unstable. The verdict "
    "reads the session gain's interval: pays when it lies wholly at or above the "
    "threshold, does not pay when wholly below, undecided when it straddles it. "
    "An arm is unstable at a level where its TTFT grows more than "
    f"{MAX_GROWTH:g} s per second of scheduled session starts or an open loop serves "
    f"under {MIN_SERVED_SHARE:g} of its offered turns (every replicate pooled): its queue "
    "grows with the run, so the verdict there is unstable instead and the gains, marked "
    f"{UNSTABLE_MARK.strip()}, depend on the run's length, not only on the system."
)


def whole_levels(frame: pl.DataFrame) -> pl.DataFrame:
    """Load levels as integers where they all are (concurrencies: 8, not 8.000)."""
    if "load_level" not in frame.columns or frame.is_empty():
        return frame
    levels = frame["load_level"].drop_nulls()
    if (levels == levels.round(0)).all():
        return frame.with_columns(pl.col("load_level").cast(pl.Int64))
    return frame


def command_path(path: Path) -> str:
    """A path as the user can type it where they ran ``plan``: relative to that folder
    when inside it, else absolute (never relative to the report's own folder)."""
    absolute = path.resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)


def evidence_lines(whatif: pl.DataFrame) -> list[str]:
    """What a plan's verdicts rest on, as lines for the console and the report: the
    profile, how its intervals were made (units, distinct replicates, parameter draws,
    the model error and its source) and each part's median share over the cells."""
    if whatif.is_empty() or "evidence" not in whatif.columns:
        return []
    first = whatif.row(0, named=True)
    lines = [f"Rests on: {first['evidence']}"]
    if not first.get("profile_fitted"):
        lines[0] += (
            " - every verdict below is on an unfitted profile: fit one with `sessiongen fit`"
        )
    units = sorted(set(whatif["unit"].drop_nulls().to_list())) if "unit" in whatif.columns else []
    draws = int(first.get("parameter_draws") or 0)
    replicates = int(first.get("replicates") or 1)
    distinct_n = sorted(set(whatif["distinct_replicates"].to_list()))
    sigmas = whatif.group_by("regime").agg(pl.col("model_error").first()).sort("regime").iter_rows()
    model = ", ".join(
        f"{regime.replace('_', ' ')} {sigma:.3g}" for regime, sigma in sigmas if sigma is not None
    )
    lines.append(
        "95% intervals combine sampling (paired bootstrap over "
        f"{' / '.join(u + 's' for u in units) or 'sessions'} of "
        f"{'/'.join(str(d) for d in distinct_n)} distinct replicate(s) of {replicates}), "
        + (
            f"the profile's parameters ({draws} bootstrap draws, a predictive interval) "
            if draws
            else "no parameter draws (the profile's values taken as exact; the sensitivity "
            "box shows what they move) "
        )
        + f"and the model's own error (log-scale SD: {model or 'unknown'}; "
        f"{first.get('model_error_source')})"
    )
    shares = whatif.select(
        pl.col("share_sampling").median(),
        pl.col("share_parameters").median(),
        pl.col("share_model").median(),
    ).row(0)
    if all(v is not None for v in shares):
        lines.append(
            "share of the interval's variance, median over cells: sampling "
            f"{shares[0]:.0%}, parameters {shares[1]:.0%}, model {shares[2]:.0%}"
        )
    notes = sorted({n for text in whatif["interval_note"].drop_nulls() for n in text.split("; ")})
    lines += [f"note: {n}" for n in notes]
    if replicates > 1 and max(distinct_n) < replicates:
        lines.append(
            f"note: {replicates - min(distinct_n)} replicate(s) repeated another's records "
            "exactly and were counted once"
        )
    return lines


def write_whatif_report(
    out: Path,
    whatif: pl.DataFrame,
    turns: pl.DataFrame,
    grid: Sequence[Config],
    varies: Sequence[Vary],
    *,
    seeds: int = 1,
    extra: Sequence[Element] = (),
) -> Path:
    """Write ``out/report/``, the decision table first (and ``extra``, e.g. a
    ``--find`` bracket, right after it); return the report.md path."""
    report = ensure_dir(out / "report")
    first = grid[0].scenario
    given = first.target.sim.profile
    profile = given or "the built-in study profile (calibration table, sessiongen.scenario)"
    note = (
        f"PLANNED (virtual clock, not measured): {first.name}, "
        f"profile {Path(given).name if given else 'built-in (study)'}"
    )
    arrival = first.load.arrival
    # a trace: no level nor context (null), and one-request sessions make a request gain
    trace = first.sessions.source == "trace"
    one_turn = trace and turns.height > 0 and turns["turn"].max() == 1
    gain = gain_name(one_turn=one_turn)
    table = trace_cells(_table(whatif, varies), trace=trace)
    decision = trace_cells(decision_table(whatif, varies), trace=trace)
    if one_turn:
        decision = decision.rename(
            {"session gain [95% CI]": "request gain [95% CI]", "sessions": "requests"},
            strict=False,
        )
    pays_at = float(whatif["pays_at"][0])
    blocks: list[Element] = [
        Heading(f"sessiongen plan: {first.name}", 1),
        Paragraph(
            "PLANNED: every figure below is the simulator's, run on a virtual clock "
            f"(no server, no wall time), over {seeds} seeded replicate"
            f"{'s' if seeds > 1 else ''} per configuration. Nothing is measured; "
            "the simulator is only as right as its profile.",
            warning=True,
        ),
        Paragraph(
            f"Scenario {first.source} (digest {first.digest()}); profile: {profile}; "
            f"{len(grid)} configurations"
            + (f", varying {', '.join(v.key for v in varies)}." if varies else ".")
        ),
        Heading(f"Decision: does the pool pay ({gain} >= {pays_at:g})?"),
        *(
            Paragraph(line, warning=not bool(whatif["profile_fitted"][0]) and i == 0)
            for i, line in enumerate(evidence_lines(whatif))
        ),
        Table(decision, max_rows=200),
        Paragraph(DECISION_METHOD),
        *extra,
        *sensitivity_section(
            out, report, whole_levels(whatif), [v.key for v in varies], note, trace=trace
        ),
        Heading("What if"),
        Table(table, max_rows=200),
    ]
    if len(grid) > 1:
        figure = whatif_figure(whatif, varies, note, arrival=arrival)
        png, _svg = figures.save_png_svg(figure, report, "whatif")
        blocks.append(Image(png, f"pool gain and median TTFT against {varies[0].key}"))
    blocks += [
        Heading("Columns"),
        Bullets(
            tuple(
                f"{k}: {v}"
                for k, v in describe_columns(
                    table.columns, varies, arrival, trace=trace, one_turn=one_turn
                )
            )
        ),
        Heading("Per turn"),
        Table(whole_levels(turns.drop("label")), max_rows=200),
        Heading("Configurations"),
        Paragraph(f"Commands as typed in {Path.cwd()}, where plan ran:"),
        Bullets(
            tuple(
                f"{c.index}: {c.label} -> sessiongen report "
                f"{command_path(out / 'configs' / c.folder)}"
                for c in grid
            )
        ),
    ]
    path = report / "report.md"
    atomic_write_bytes(path, to_markdown(blocks, report).encode())
    atomic_write_bytes(report / "report.html", to_html(blocks, f"plan {first.name}").encode())
    return path


def _or_nan(value: float | None) -> float:
    """A figure's point: NaN (a gap in the line) where the table has none."""
    return math.nan if value is None else float(value)
