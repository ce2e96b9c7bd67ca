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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen.analysis.load import MAX_GROWTH, MIN_SERVED_SHARE
from sessiongen.analysis.whatif import (
    Config,
    Vary,
    describe_columns,
    gain_name,
    trace_cells,
)
from sessiongen.infra.files import atomic_write_bytes, ensure_dir
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
        row[units_label(r.get("unit"))] = r["sessions"]
        row["verdict"] = r.get("verdict_text") or r["verdict"]
        rows.append(row)
    return pl.DataFrame(rows)


def units_label(unit: object) -> str:
    """The column that counts an interval's units, named by what was resampled: "sessions",
    or a trace's "time blocks" (the same count on the console, in the plan's report and in
    a configuration's)."""
    return f"{unit}s" if isinstance(unit, str) and unit else "sessions"


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
    same = placements_alike(whatif)
    if same:
        lines.append(
            f"note: {' and '.join(same)} planned the same figures in every cell: they send "
            "each request to the same replica here (sessions of one request, as a trace "
            "whose lines carry no session ids has, have no later turn to move), so the "
            "client's placement cannot matter for this traffic; a router policy can"
        )
    return lines


#: The gain figures two placements must share, cell by cell, to be planned alike.
ALIKE = ("session_gain", "session_gain_low", "session_gain_high", "ttft_p50_off_s", "ttft_p50_on_s")


def placements_alike(whatif: pl.DataFrame) -> list[str]:
    """The client placements (not ``router:``) that planned identical figures (:data:`ALIKE`)
    in every cell of ``whatif``: [] unless two or more do. Equal to the bit, which differing
    placements of sessions with later turns never give."""
    if "placement" not in whatif.columns or not set(ALIKE) <= set(whatif.columns):
        return []
    client = whatif.filter(~pl.col("placement").str.starts_with("router:"))
    names = client["placement"].unique(maintain_order=True).to_list()
    if len(names) < 2:
        return []
    keys = [c for c in ("config", "context_tokens", "load_level") if c in client.columns]
    shapes = client.group_by(keys, maintain_order=True).agg(
        *(pl.col(c).n_unique().alias(c) for c in ALIKE)
    )
    alike = shapes.filter(pl.all_horizontal(pl.col(c) == 1 for c in ALIKE))
    return names if alike.height == shapes.height else []


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
            {"session gain [95% CI]": "request gain [95% CI]"},
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
        *_sensitivity(out, report, whatif, varies, note, trace=trace),
        Heading("What if"),
        Table(table, max_rows=200),
    ]
    if len(grid) > 1:
        # the figure's modules (matplotlib) only where there is a figure to draw
        from sessiongen.report.figures import save_png_svg
        from sessiongen.report.whatifplot import whatif_figure

        figure = whatif_figure(whatif, varies, note, arrival=arrival)
        png, _svg = save_png_svg(figure, report, "whatif")
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


def _sensitivity(
    out: Path,
    report: Path,
    whatif: pl.DataFrame,
    varies: Sequence[Vary],
    note: str,
    *,
    trace: bool,
) -> list[Element]:
    """The sensitivity section where the plan read its verdicts at the box's ends (its
    rows have a robustness); its module draws (matplotlib), so it is imported only then."""
    if "robustness" not in whatif.columns:
        return []
    from sessiongen.report.tornado import sensitivity_section

    keys = [v.key for v in varies]
    return sensitivity_section(out, report, whole_levels(whatif), keys, note, trace=trace)
