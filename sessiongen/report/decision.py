"""The answer first: the pool decision a replay's report and console open with.

The same decision ``sessiongen plan`` gives, from the same reduction
(:func:`sessiongen.analysis.payoff.measured_decision`: the planner's what-if rows, the
arms' stability and :func:`~sessiongen.analysis.payoff.with_verdicts`), shown with the
same table (:func:`sessiongen.report.whatif.decision_table`): per placement (and
context, load level) the session gain with its 95% interval on sessions, the later-turn
gain, the verdict at ``pays_at`` ("pays", "does not pay", "undecided", "not enough
data", or unstable), and the **median per-turn gain (turns 2..)** beside it. A replay's
figures are measurements: their intervals are the sampling ones (the paired session
bootstrap), with no model error added, and the verdict reads them.

Where one later turn's own gain (median TTFT OFF / ON of that turn) stands :data:`SHARP`
times or more away from the median per-turn gain, the table names it ("turn 2: 4.20x"):
a median over turns of 1.00 can hide a turn the pool made four times faster.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.payoff import ARM, measured_decision, turn_table
from sessiongen.analysis.stats import MIN_SESSIONS
from sessiongen.analysis.whatif import WHATIF_COLUMNS, gain_name
from sessiongen.records.run import Run
from sessiongen.report.document import Element, Heading, Paragraph, Table
from sessiongen.report.whatif import decision_table

#: A later turn is named beside the median per-turn gain when its own gain is this many
#: times larger or smaller (pressure32k: a median of 1.00 over turns hid
#: turn 2's 4.2x; a factor of 1.5 names that and leaves the turn-to-turn noise of a
#: small run, a few tens of percent, unnamed).
SHARP = 1.5
#: Turns named per cell at most (the farthest first).
MAX_NAMED = 3

#: The displayed names of the decision's figures (one name per figure, everywhere).
PER_TURN = "median per-turn gain (turns 2..)"
APART = "turns apart from that median"


@dataclass(frozen=True)
class Decision:
    """A replay's decision: the verdict rows, its per-turn gains and how to name them."""

    rows: pl.DataFrame
    turns: pl.DataFrame
    pays_at: float
    gain: str
    trace: bool
    plan: Path | None = None
    """The plan folder whose rows these are, for a configuration ``sessiongen plan`` ran
    (:func:`plan_rows`); None for a replay's measured rows."""
    planned: bool = False
    """The run is the planner's (a virtual clock), with or without its plan's rows."""

    @property
    def heading(self) -> str:
        return f"Decision: does the pool pay ({self.gain} >= {self.pays_at:g})?"

    @property
    def kind(self) -> str:
        """How the figures came: "PLANNED" (the simulator's) or "MEASURED"."""
        return "PLANNED" if self.planned else "MEASURED"

    @property
    def unit(self) -> str:
        """What the intervals resample: "session", or a trace's "time block"."""
        units = self.rows["unit"].drop_nulls() if "unit" in self.rows.columns else None
        return str(units[0]) if units is not None and units.len() else "session"


def decide(run: Run, pays_at: float) -> Decision | None:
    """The decision of a run with both cache arms (None for a one-arm run: there is no
    gain to read). ``run`` keeps its load levels as a column (not
    :meth:`~sessiongen.records.run.Run.levels_apart`): they are a key of the rows."""
    if set(run.ok["cache"].unique().to_list()) != {"off", "on"}:
        return None
    turns = turn_table(run)
    one_turn = run.trace and turns.height > 0 and turns["turn"].max() == 1
    planned = run.meta.target_kind == "plan"
    found = plan_rows(run.path) if planned else None
    return Decision(
        rows=found[1] if found is not None else measured_decision(run, pays_at),
        turns=turns,
        pays_at=float(found[1]["pays_at"][0]) if found is not None else pays_at,
        gain=gain_name(one_turn=bool(one_turn)),
        trace=run.trace,
        plan=found[0] if found is not None else None,
        planned=planned,
    )


#: A plan's configuration folder: ``configs/NN-label`` or its replicate ``NN-label.rK``.
CONFIG_FOLDER = re.compile(r"^(\d+)-")


def plan_rows(run_dir: Path) -> tuple[Path, pl.DataFrame] | None:
    """The plan's own rows (``whatif.parquet``: replicates pooled, the model's error in
    the interval, the plan's verdict) for the configuration ``run_dir`` holds one
    replicate of, with the plan folder; None where ``run_dir`` is not in a plan's
    ``configs/`` or the plan has no rows for it."""
    match = CONFIG_FOLDER.match(run_dir.name)
    plan = run_dir.parent.parent
    if match is None or run_dir.parent.name != "configs":
        return None
    try:
        whatif = pl.read_parquet(plan / "whatif.parquet")
    except (OSError, pl.exceptions.PolarsError):
        return None
    if "config" not in whatif.columns or "pays_at" not in whatif.columns:
        return None
    rows = whatif.filter(pl.col("config") == int(match.group(1)))
    return (plan, rows) if rows.height else None


def apart(d: Decision) -> list[str]:
    """Per row of ``d.rows``: the later turns whose own gain stands :data:`SHARP` times
    or more from the row's median per-turn gain ("turn 2: 4.20x"; "" when none)."""
    out = []
    for r in d.rows.iter_rows(named=True):
        median = r["later_turn_gain"]
        turns = d.turns.filter(
            *(pl.col(k).eq_missing(r[k]) for k in ARM), pl.col("turn") >= 2
        ).filter(pl.col("pool_gain").is_not_null() & pl.col("pool_gain").is_finite())
        far = []
        if median is not None and median > 0 and math.isfinite(median):
            for t in turns.iter_rows(named=True):
                gain = t["pool_gain"]
                if gain > 0 and abs(math.log(gain / median)) >= math.log(SHARP):
                    far.append((abs(math.log(gain / median)), t["turn"], gain))
        far.sort(reverse=True)
        named = [f"turn {turn}: {gain:.2f}x" for _, turn, gain in far[:MAX_NAMED]]
        if len(far) > MAX_NAMED:
            named.append(f"{len(far) - MAX_NAMED} more")
        out.append(", ".join(named))
    return out


def table(d: Decision) -> pl.DataFrame:
    """The plan's decision table for these rows, the median per-turn gain and the turns
    apart from it added after the later-turn gain; context and load level shown where
    they vary (a trace has neither)."""
    frame = decision_table(d.rows, ())
    at = frame.columns.index("later-turn gain [95% CI]") + 1
    per_turn = ["-" if v is None else f"{v:.2f}" for v in d.rows["later_turn_gain"]]
    named = [text or "-" for text in apart(d)]
    frame = frame.insert_column(at, pl.Series(APART, named, dtype=pl.String))
    frame = frame.insert_column(at, pl.Series(PER_TURN, per_turn, dtype=pl.String))
    if d.gain != "session gain":
        frame = frame.rename({"session gain [95% CI]": f"{d.gain} [95% CI]"})
    if d.trace:  # no level nor initial context: each request has its own
        return frame.drop("load_level", "context_tokens")
    if frame["load_level"].n_unique() <= 1:  # one level: the scenario's, said elsewhere
        frame = frame.drop("load_level")
    return drop_single_context(frame)


def _definitions(d: Decision) -> str:
    gain = WHATIF_COLUMNS["session_gain"]
    if d.gain != "session gain":
        gain = gain.replace("session", "request")
    later = WHATIF_COLUMNS["later_gain"].removesuffix(", every replicate pooled")  # a plan's
    if d.planned:
        return _planned_definitions(d, gain, later)
    return (
        f"MEASURED: {d.gain} = {gain}; later-turn gain = {later}, every later turn pooled; "
        f"{PER_TURN} = the median over turns 2.. of each turn's own gain (its median TTFT "
        f"OFF / ON), with the turns whose own gain is {SHARP:g}x or more away from it named. "
        f"Intervals are 95% paired bootstraps over {d.unit}s (sampling only: these are "
        f"measurements, no model error is added). The verdict reads the {d.gain}'s "
        f"interval against {d.pays_at:g} (--pays-at): pays when it lies wholly at or "
        "above, does not pay when wholly below, undecided when it straddles it, not "
        f"enough data below {MIN_SESSIONS} {d.unit}s, unstable where an arm's queue grows "
        "with the run; as sessiongen plan decides."
    )


def _planned_definitions(d: Decision, gain: str, later: str) -> str:
    """What a planned run's decision figures are: the plan's, model error included."""
    turns = (
        f"{PER_TURN} = the median over turns 2.. of each turn's own gain (its median TTFT "
        f"OFF / ON), with the turns of this folder's records {SHARP:g}x or more away from "
        "it named."
    )
    if d.plan is None:
        return (
            f"PLANNED: every figure is the simulator's, on a virtual clock, not measured. "
            f"{d.gain} = {gain}; later-turn gain = {later}; {turns} This run is not in a "
            f"plan's folder: its intervals are 95% paired bootstraps over {d.unit}s of this "
            "run alone, with no model error, narrower than the model's accuracy "
            "allows, and the verdict read off them is not a plan's. sessiongen plan gives "
            "the interval to act on."
        )
    note = str(d.rows["interval_note"][0]) if "interval_note" in d.rows.columns else ""
    replicates = d.rows["replicates"][0] if "replicates" in d.rows.columns else None
    pooled = f"{replicates} replicates pooled" if replicates is not None else "its replicates"
    return (
        f"PLANNED: every figure is the simulator's, on a virtual clock, not measured. The "
        f"rows are the plan's own for this configuration ({d.plan.name}/whatif.parquet: "
        f"{pooled}), its interval and verdict as sessiongen plan gave them"
        + (f" ({note})" if note else "")
        + f"; {d.gain} = {gain}; later-turn gain = {later}; {turns} The verdict reads the "
        f"interval against {d.pays_at:g}, the plan's --pays-at."
    )


def section(d: Decision | None) -> list[Element]:
    """The report's first section: the decision table and what its figures mean."""
    if d is None:
        return [
            Heading("Decision: does the pool pay?"),
            Paragraph(
                "No decision: this run has one cache arm. Combine it with a run of the "
                "other arm (sessiongen report RUN_OFF RUN_ON) for the gain and its verdict."
            ),
        ]
    return [Heading(d.heading), Table(table(d)), Paragraph(_definitions(d))]


def console_text(d: Decision | None, target: str) -> str:
    """The decision as the console's first lines after a run: the same table as text."""
    if d is None:
        return "Decision: none (one cache arm; combine runs with sessiongen report RUN_OFF RUN_ON)"
    frame = table(d)
    cells = [list(frame.columns)] + [
        ["-" if v is None or v == "" else str(v) for v in row] for row in frame.iter_rows()
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(frame.columns))]
    lines = [f"{d.heading} {d.kind} (target: {target})"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]  # fmt: skip
    return "\n".join(lines)
