"""The run report: ``RUN_DIR/report/`` with report.md, report.html, summary.csv and plots.

:func:`write_report` loads a run (:func:`load_run`, re-exported here), computes the
analysis frames once, draws the figures, and writes:

- ``report.md`` and a self-contained ``report.html`` (images embedded as base64). They
  open with **the answer**: the pool decision per placement (and context, load level),
  as ``sessiongen plan`` gives it (:mod:`sessiongen.report.decision`: the session gain
  and the later-turn gain with their intervals on sessions, the median per-turn gain and
  the turns far from it, the verdict at ``pays_at``), with a pointer to the problems
  when there are any; then **problems** (correctness verdicts, counted against the OFF
  arm on the same prompt: :mod:`sessiongen.report.correctness`; for the ``equivalence``
  probe the divergence rate, the largest first-token logprob difference and the worst
  case; then contamination, request errors, block drift larger than a turn's effect,
  incomplete blocks), after the **limits** of a run too small for its statistics
  (:func:`sessiongen.analysis.interval_warnings`: too few sessions for the intervals,
  block drift not checked); then, for a trace run, what reuse the trace allows and how
  much of it each arm got (:mod:`sessiongen.report.reusesection`); the headline speedup
  curves, the details, the method and the run's identity;
- ``decision.csv``: the decision's rows, one per placement (and context, load level),
  with the what-if columns' names and meanings
  (:data:`~sessiongen.analysis.whatif.WHATIF_COLUMNS`: ``session_gain``, ``later_gain``,
  ``later_turn_gain``, ``verdict``, ...), as ``whatif.parquet`` holds a plan's;
- ``summary.csv``: one row per placement, cache and turn with the columns
  :data:`SUMMARY_COLUMNS` (plus ``context_tokens`` after ``cache`` when the run has more
  than one context size). The speedup columns are filled on the ``cache = on`` rows
  only, and left empty on ``off`` rows, so that summing or averaging a column never
  counts a speedup twice;
- ``speedup``, ``median_ttft``, ``ttft_cdf`` and ``cache_attribution`` as PNG and SVG.

All durations are modeled seconds (see :mod:`sessiongen.records.run`). Every file is written
atomically.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.payoff import DEFAULT_PAYS_AT
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.infra.files import atomic_write_bytes, ensure_dir
from sessiongen.records.run import Run, load_run
from sessiongen.report import plots
from sessiongen.report.cautions import (
    CAUTIONS_FILE,
    point_to_problems,
    read_cautions,
    report_cautions,
)
from sessiongen.report.decision import Decision, decide, section
from sessiongen.report.describe import (
    header_section,
    identity_section,
    method_section,
    overhead_section,
)
from sessiongen.report.details import details_section, fidelity_section
from sessiongen.report.document import (
    Element,
    to_html,
    to_markdown,
)
from sessiongen.report.frames import Frames
from sessiongen.report.headline import (
    DECISION_FILE,
    HEADLINE,
    decision_frame,
    headline_section,
)
from sessiongen.report.loadsection import is_load_run, load_section
from sessiongen.report.problems import limits_section, problems_section
from sessiongen.report.reusesection import reuse_section
from sessiongen.report.routing import routing_section

__all__ = [
    "HEADLINE",
    "SUMMARY_COLUMNS",
    "Frames",
    "build_blocks",
    "run_cautions",
    "summary_frame",
    "write_report",
]

SUMMARY_COLUMNS = (
    "placement",
    "cache",
    "turn",
    "n",
    "sessions",
    "errors",
    "median_ttft_s",
    "ci_low_s",
    "ci_high_s",
    "ttft_log_se",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_log_se",
    "divergences",
    "pool_divergences",
    "cache_failures",
    "off_inconsistent",
    "on_only",
)


def summary_frame(summary: pl.DataFrame) -> pl.DataFrame:
    """The ``summary.csv`` columns of :func:`sessiongen.analysis.latency.run_summary`."""
    cols = list(SUMMARY_COLUMNS)
    if summary["context_tokens"].n_unique() > 1:
        cols.insert(2, "context_tokens")
    return summary.select(cols)


def build_blocks(
    run: Run,
    frames: Frames,
    figures: dict[str, Path],
    boot: Bootstrap,
    *,
    decision: Sequence[Element] = (),
    verdicts: pl.DataFrame | None = None,
    load: Sequence[Element] = (),
    reuse: Sequence[Element] = (),
) -> list[Element]:
    """The report as document blocks, its sections in reading order: the ``decision``
    first (none given: none shown), then limits and problems (``verdicts``, the
    decision's rows: a problem that can move none of them is a note), the routers, a load run's
    ``load`` headline and a trace's ``reuse`` (what the trace allows, before the headline
    of what the pool bought), the per-turn curve, and the details."""
    sections: list[Sequence[Element]] = [
        header_section(run),
        decision,
        limits_section(run, frames),
        problems_section(run, frames, verdicts),
        routing_section(run, boot),
        load,
        reuse,
        headline_section(run, frames, figures, boot),
        details_section(frames, figures),
        fidelity_section(run, frames),
        overhead_section(run),
        method_section(run, boot, frames.equivalence.logprob_tol),
        identity_section(run),
    ]
    return [block for section in sections for block in section]


def write_report(
    run_dir: str | Path,
    *,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
    logprob_tol: float = analysis.LOGPROB_TOL,
    pays_at: float = DEFAULT_PAYS_AT,
    decision: Decision | None = None,
) -> Path:
    """Write ``RUN_DIR/report/`` (see the module docstring); return the report.md path.

    ``logprob_tol`` is the equivalence probe's tolerance on first-token logprob
    differences (:data:`sessiongen.analysis.checks.LOGPROB_TOL`); ``pays_at`` the
    session gain the decision's verdict reads its interval against (``--pays-at``).
    ``decision``: the run's decision where the caller has it already
    (:func:`sessiongen.report.decision.decide` on this run at ``pays_at``), else
    computed here.
    """
    whole = load_run(run_dir)
    run = whole.levels_apart()  # per-arm sections never pool requests made at different loads
    out = run.path / "report"
    ensure_dir(out)
    frames = Frames.compute(run, boot, logprob_tol)
    figures = plots.write_figures(
        run, out, speedups=frames.speedup, arm_table=frames.arm, attribution=frames.attribution
    )
    atomic_write_bytes(out / "summary.csv", summary_frame(frames.summary).write_csv().encode())
    if decision is None:
        decision = decide(whole, pays_at)  # its rows keep the levels as a key
    if decision is not None:
        atomic_write_bytes(out / DECISION_FILE, decision_frame(decision).write_csv().encode())
    note = plots.caption(run)
    blocks = build_blocks(
        run,
        frames,
        figures,
        boot,
        decision=section(decision),
        verdicts=decision.rows if decision is not None else None,
        load=load_section(whole, out, note, boot) if is_load_run(run) else (),
        reuse=reuse_section(run, out, note) if run.trace else (),
    )
    point_to_problems(blocks)
    atomic_write_bytes(out / "report.md", to_markdown(blocks, out).encode())
    html = to_html(blocks, f"sessiongen report: {run.run_id}")
    atomic_write_bytes(out / "report.html", html.encode())
    cautions = json.dumps(report_cautions(blocks), indent=2) + "\n"
    atomic_write_bytes(out / CAUTIONS_FILE, cautions.encode())
    return out / "report.md"


def run_cautions(
    run_dir: str | Path, *, boot: Bootstrap = DEFAULT_BOOTSTRAP
) -> dict[str, list[str]]:
    """A run's Problems and Limits as its report states them: read from its
    ``report/cautions.json`` where a report was written, else computed the same way
    (:func:`build_blocks`, nothing written). The notebook shows these."""
    written = read_cautions(Path(run_dir) / "report")
    if written is not None:
        return written
    whole = load_run(run_dir)
    run = whole.levels_apart()
    figures = {name: Path(f"{name}.png") for name in plots.FIGURE_NAMES}  # not drawn
    decision = decide(whole, DEFAULT_PAYS_AT)
    verdicts = decision.rows if decision is not None else None
    return report_cautions(
        build_blocks(run, Frames.compute(run, boot), figures, boot, verdicts=verdicts)
    )
