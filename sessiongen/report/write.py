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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from scipy import stats as sps

from sessiongen import analysis
from sessiongen.analysis import stats
from sessiongen.analysis.drift import not_checked
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.payoff import DEFAULT_PAYS_AT
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, MIN_SESSIONS, Bootstrap
from sessiongen.analysis.verdicts import Correctness, Equivalence
from sessiongen.calibrate.verdict import DEFINITION, figure_lines
from sessiongen.calibrate.verdict import verdict as calibration_verdict
from sessiongen.infra.files import atomic_write_bytes, ensure_dir
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run, load_run
from sessiongen.report import plots
from sessiongen.report.correctness import basis_note, correctness_passed, correctness_problems
from sessiongen.report.decision import Decision, decide, section
from sessiongen.report.document import (
    Bullets,
    Element,
    Heading,
    Image,
    Paragraph,
    Table,
    format_value,
    to_html,
    to_markdown,
)
from sessiongen.report.loadsection import is_load_run, load_section
from sessiongen.report.reusesection import reuse_section
from sessiongen.report.routing import routing_section

__all__ = [
    "SUMMARY_COLUMNS",
    "read_cautions",
    "report_cautions",
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


HEADLINE = "Headline: shared-cache speedup per turn"

TOKEN_MEANS = ("prompt_tokens", "cached_tokens", "local_hit_tokens", "external_hit_tokens")


@dataclass(frozen=True)
class Frames:
    """Everything the report shows, computed once."""

    arm: pl.DataFrame
    speedup: pl.DataFrame
    summary: pl.DataFrame
    cross: pl.DataFrame
    cold: pl.DataFrame
    sessions: pl.DataFrame
    drift: pl.DataFrame
    attribution: pl.DataFrame
    contamination: pl.DataFrame
    needles: pl.DataFrame
    divergences: pl.DataFrame
    correctness: Correctness
    error: pl.DataFrame
    cold_check: pl.DataFrame
    lag: pl.DataFrame

    @property
    def equivalence(self) -> Equivalence:
        return self.correctness.equivalence

    @classmethod
    def compute(
        cls, run: Run, boot: Bootstrap, logprob_tol: float = analysis.LOGPROB_TOL
    ) -> Frames:
        speedup = analysis.speedup_table(run, boot=boot)
        return cls(
            arm=analysis.arm_turn_table(run, boot=boot),
            speedup=speedup,
            summary=analysis.run_summary(run, boot=boot, logprob_tol=logprob_tol),
            cross=analysis.cross_vs_same(run, boot=boot),
            cold=analysis.cold_first_turns(run, boot=boot),
            sessions=analysis.session_speedup(run, boot=boot),
            drift=analysis.block_drift(run, boot=boot, speedups=speedup),
            attribution=analysis.cache_attribution(run),
            contamination=analysis.contamination(run),
            needles=analysis.needle_grades(run),
            divergences=analysis.divergences(run, logprob_tol=logprob_tol),
            correctness=analysis.correctness(run, logprob_tol=logprob_tol),
            error=analysis.measurement_error(run),
            cold_check=analysis.cold_turn_asymmetry(run, boot=boot),
            lag=analysis.lag_effect(run),
        )


def summary_frame(summary: pl.DataFrame) -> pl.DataFrame:
    """The ``summary.csv`` columns of :func:`sessiongen.analysis.latency.run_summary`."""
    cols = list(SUMMARY_COLUMNS)
    if summary["context_tokens"].n_unique() > 1:
        cols.insert(2, "context_tokens")
    return summary.select(cols)


def _show(frame: pl.DataFrame, *columns: str) -> Table:
    """A display table: the chosen columns, context_tokens dropped when single-valued."""
    present = [c for c in columns if c in frame.columns]
    return Table(drop_single_context(frame.select(present)))


def _header(run: Run) -> list[Element]:
    meta = run.meta
    blocks: list[Element] = [
        Heading(f"sessiongen report: {run.run_id}", 1),
        Paragraph(
            f"Scenario {run.scenario_name} (digest {meta.scenario_digest}); target "
            f"{run.target_label}, time scale {run.time_scale:g}; started "
            f"{meta.started_at or '?'}, ended {meta.ended_at or '?'}."
        ),
        Paragraph(
            (
                "All durations are modeled seconds: measured wall seconds divided by the time "
                f"scale ({run.time_scale:g}). "
                if run.modeled
                else "All durations are measured seconds. "
            )
            + f"{run.requests.height} requests analysed; "
            f"{run.warmup_rows} warm-up requests excluded."
        ),
    ]
    if run.simulated:
        blocks.append(Paragraph(_simulated_note(run)))
    fault = meta.fault_line()
    if fault is not None:
        blocks.append(Paragraph(fault, warning=True))
    if meta.complete is False:
        blocks.append(Paragraph("This run is INCOMPLETE (complete: false).", warning=True))
    return blocks


def _simulated_note(run: Run) -> str:
    """Which simulator the replicas were, and where the time scale came from."""
    if run.meta.target_kind == "sim":
        return "SIMULATED target: the replicas were the embedded simulator."
    if run.meta.target_kind == "plan":
        return "SIMULATED target: planned on the simulator's virtual clock (no replicas ran)."
    if run.modeled:
        return (
            "SIMULATED target: the endpoints said they are simulated replicas (their "
            f"/version), at time scale {run.time_scale:g}, so durations are converted to "
            "modeled seconds as for the embedded simulator."
        )
    return (
        "SIMULATED target: the endpoints said they are simulated replicas (their /version) "
        "but not their time scale, so durations are left in measured wall seconds; divide "
        "by the time scale they were served at for modeled seconds."
    )


def _contamination_method(run: Run) -> str:
    if run.trace:
        return (
            "Contamination: turn-1 cached/local/external hit tokens above what the trace says "
            "the request shares with earlier ones (trace_shared_tokens, plus the chat "
            "template), or external hits with the cache off. Correctness probes (needles, "
            "equivalence) are synthetic-only: not exercised on a trace."
        )
    return (
        "Contamination: turn-1 cached/local/external hit tokens above "
        f"{run.shared_prefix_tokens} (shared prefix), or external hits with the cache off."
    )


def _durations(run: Run) -> str:
    """The method's line on the unit of every duration."""
    if not run.modeled:
        return "Durations: measured wall seconds, as the client timed them."
    if run.meta.target_kind == "plan":
        return "Durations: modeled seconds on the planner's virtual clock."
    source = (
        "target.sim.time_scale"
        if run.meta.target_kind == "sim"
        else "as the simulated replicas reported it (/version)"
    )
    return f"Durations: modeled seconds = measured / time scale ({run.time_scale:g}, {source})."


LIMITS = "Limits of this run"


def _limits(run: Run, f: Frames) -> list[Element]:
    """What the run is too small to show (sessions for the intervals, drift and cold
    turns unchecked), and requests that reached the simulator after their modeled
    arrival by less than would move a comparison (more is a problem:
    :func:`_trust_problems`)."""
    warnings = analysis.interval_warnings(run)
    warnings += [w for w in [analysis.cold_check_limit(f.cold_check)] if w is not None]
    late = analysis.late_arrivals(run)
    if not late["flagged"].any():
        warnings += [w for w in [analysis.late_arrival_warning(run, late)] if w is not None]
    if not warnings:
        return []
    return [Heading(LIMITS), *(Paragraph(w, warning=True) for w in warnings)]


def _drift_summary(f: Frames) -> str:
    """How the None-found sentence names block drift: checked, or not."""
    if f.drift.is_empty() or f.drift["checked"].all():
        return "no block drift larger than a turn's effect"
    return f"block drift {not_checked()} in some arms (see Limits)"


def _measurement_problems(run: Run, f: Frames) -> list[Element]:
    out: list[Element] = []
    if not f.contamination.is_empty():
        out.append(
            Paragraph(
                f"Contamination: {f.contamination.height} requests hit a cache where none should "
                f"(turn 1 above {run.shared_prefix_tokens} shared-prefix tokens, or an external "
                "hit with the cache off).",
                warning=True,
            )
        )
        out.append(Table(drop_single_context(f.contamination), max_rows=20))
    errors = f.arm.filter(pl.col("errors") > 0)
    if not errors.is_empty():
        out.append(Paragraph(f"Request errors: {int(errors['errors'].sum())}.", warning=True))
        out.append(_show(errors, "placement", "cache", "context_tokens", "turn", "errors", "n"))
        kinds = (
            run.requests.filter(pl.col("status") != "ok")
            .group_by("status", "error")
            .len()
            .sort("len", descending=True)
        )
        out.append(Table(kinds, max_rows=5))
    flagged = f.drift.filter(pl.col("flagged"))
    if not flagged.is_empty():
        out.append(Paragraph("Block drift larger than that turn's ON/OFF effect:", warning=True))
        out.append(_drift_table(flagged))
    bad_blocks = [dict(b) for b in run.meta.blocks if b.get("status", "ok") != "ok"]
    if bad_blocks:
        out.append(Paragraph(f"{len(bad_blocks)} blocks did not finish:", warning=True))
        out.append(Table(pl.DataFrame(bad_blocks)))
    moved = f.lag.filter(pl.col("moved"))
    if not moved.is_empty():
        worst = moved.sort(pl.col("shift").abs(), descending=True).row(0, named=True)
        out += [
            Paragraph(
                f"Client event-loop lag moved the median TTFT of {moved.height} cells by more "
                f"than {analysis.ERROR_SHARE:.0%} (worst {worst['shift']:+.1%}: "
                f"{worst['placement']}/{worst['cache']} turn {worst['turn']}, "
                f"{worst['lagged']} of {worst['n']} requests lag-flagged): replacing each "
                "flagged request by its session's unflagged TTFT from the cell's other "
                "blocks changes those figures.",
                warning=True,
            ),
            _show(moved, *CELL_KEYS, "n", "lagged", "median_ttft_s", "median_unlagged_s", "shift"),
        ]
    return out


def _lag_note(f: Frames) -> list[Element]:
    """Lag that moved no figure: a note after the Problems, not one of them (the quick
    start's Problems carried it on a busy machine)."""
    lagged = int(f.lag["lagged"].sum()) if not f.lag.is_empty() else 0
    if not lagged or f.lag["moved"].any():
        return []
    unchecked = int(f.lag["unverifiable"].sum())
    checked = lagged - unchecked
    text = (
        f"Event-loop lag: {lagged} requests were lag-flagged (the client's loop stalled for "
        "more than 2% of their TTFT while they waited). "
    )
    if checked:
        text += (
            f"Replacing {'each' if not unchecked else f'{checked} of them'} by the same "
            "session's unflagged TTFT from the cell's other blocks moves no cell's median "
            f"TTFT by more than {analysis.ERROR_SHARE:.0%}. "
        )
    if unchecked:
        text += (
            f"{unchecked} could not be checked (no unflagged TTFT of the same session in "
            "another block of the arm)."
        )
    else:
        text += "No figure here rests on them."
    # no evidence a figure moved: a note, not a warning
    return [Paragraph(text.strip())]


def _trust_problems(run: Run, f: Frames) -> list[Element]:
    """What makes every speedup of the run unreadable: said before anything else."""
    out: list[Element] = []
    cold = f.cold_check.filter(pl.col("flagged"))
    if not cold.is_empty():
        worst = cold.sort((pl.col("speedup") - 1).abs(), descending=True).row(0, named=True)
        out += [
            Paragraph(
                f"Arms differ beyond the cache: cold first turns (nothing cached in either "
                f"arm) took {worst['median_off_s']:.3g} with the cache off and "
                f"{worst['median_on_s']:.3g} with it on ({worst['placement']}, "
                f"{worst['speedup']:.2f}x, interval {worst['speedup_ci_low']:.2f} to "
                f"{worst['speedup_ci_high']:.2f}). No speedup of this run can be read as "
                "the cache's alone.",
                warning=True,
            ),
            _show(
                cold,
                "placement",
                "context_tokens",
                "median_off_s",
                "median_on_s",
                "speedup",
                "speedup_ci_low",
                "speedup_ci_high",
                "n_units",
            ),
        ]
    errors = f.error.filter(pl.col("flagged"))
    if not errors.is_empty():
        worst = errors.sort(pl.col("error_share").abs(), descending=True).row(0, named=True)
        out += [
            Paragraph(
                f"Measurement error above {analysis.ERROR_SHARE:.0%} of the median TTFT in "
                f"{errors.height} of {f.error.height} cells (worst {worst['error_share']:+.1%}: "
                f"{worst['placement']}/{worst['cache']} turn {worst['turn']}). The client's "
                "and the simulator's own lateness, divided by the time scale, is that large "
                f"a part of what was measured: {analysis.time_scale_remedy(run)}.",
                warning=True,
            )
        ]
    late = analysis.late_arrivals(run)
    if late["flagged"].any():
        text = analysis.late_arrival_warning(run, late)
        assert text is not None  # a flagged cell has late requests
        out += [
            Paragraph(text, warning=True),
            _show(
                late.filter(pl.col("flagged")),
                *CELL_KEYS,
                "n",
                "late",
                "max_late_s",
                "median_ttft_s",
                "late_share",
            ),
        ]
    return out


def _arm_problems(run: Run) -> list[Element]:
    """Blocks whose own counters contradict their cache arm (:mod:`sessiongen.analysis.arms`)."""
    check = analysis.arm_check(run)
    bad = check.filter(pl.col("status") == "mislabeled")
    if bad.is_empty():
        return []
    return [
        Paragraph(
            f"Mislabeled arm: {bad.height} of {check.height} blocks are not in the cache arm "
            "they are labeled with, by what their replicas counted or said: "
            + "; ".join(bad["evidence"].to_list())
            + ". Speedups that use these blocks compare something other than the shared cache.",
            warning=True,
        ),
        _show(bad, *[c for c in bad.columns if c != "evidence"]),
    ]


def _problems(run: Run, f: Frames) -> list[Element]:
    correct = correctness_problems(f.correctness, f.summary, f.divergences)
    passed = correctness_passed(f.correctness)
    basis = basis_note(f.correctness) if correct or passed else []
    found = _trust_problems(run, f) + _arm_problems(run) + correct + _measurement_problems(run, f)
    if not found:
        found = [
            Paragraph(
                "None found: no cache failures, no contamination, no request "
                f"errors, {_drift_summary(f)}."
            )
        ]
    notes = [*passed, *basis, *_lag_note(f)]
    return [Heading("Problems"), *found, *([Heading("Notes"), *notes] if notes else [])]


def _headline(run: Run, f: Frames, figures: dict[str, Path], boot: Bootstrap) -> list[Element]:
    fewest = analysis.fewest_sessions(run)
    coverage = analysis.coverage_note(fewest) if fewest is not None else None
    return [
        Heading(HEADLINE),
        Paragraph(
            "Speedup = median TTFT with the cache off / median TTFT with it on, per placement "
            f"and turn; {boot.method()}; 'paired' means sessions were resampled as units "
            "in both arms at once."
        ),
        Image(figures["speedup"], "speedup per turn, one line per placement, with CI bands"),
        _show(
            f.speedup,
            "placement",
            "context_tokens",
            "turn",
            "median_off_s",
            "median_on_s",
            "speedup",
            "speedup_ci_low",
            "speedup_ci_high",
            "paired",
            "n_off",
            "n_on",
        ),
        *_pool_overhead(f),
        *([Paragraph(coverage)] if coverage and fewest and fewest >= MIN_SESSIONS else []),
    ]


def _pool_overhead(f: Frames) -> list[Element]:
    """Later turns the pool served where it surely costs more than recomputing.

    One-sided tests of "speedup < 1" from each cell's standard error (normal on the log
    scale), Holm-corrected over the later turns with pool hits: a run has many cells, and
    one in twenty would look slower by chance.
    """
    hits = f.attribution.filter(pl.col("cache") == "on").select(
        "placement", "context_tokens", "turn", "external_hit_tokens", "prompt_tokens"
    )
    cells = f.speedup.filter(pl.col("turn") > 1).join(
        hits, on=["placement", "context_tokens", "turn"], how="inner"
    )
    cells = cells.filter(
        pl.col("external_hit_tokens") > 0,
        pl.col("speedup_log_se") > 0,
        pl.col("speedup").is_not_null(),
    )
    if cells.is_empty():
        return []
    z = (cells["speedup"].log() / cells["speedup_log_se"]).to_numpy()
    adjusted = stats.holm(sps.norm.cdf(z))
    slower = cells.with_columns(p=pl.Series(adjusted)).filter(pl.col("p") < 0.05)
    if slower.is_empty():
        return []
    parts = [
        f"{r['placement']} context {r['context_tokens']} turn {r['turn']} "
        f"{r['speedup']:.2f}x [{r['speedup_ci_low']:.3f}, {r['speedup_ci_high']:.3f}] with "
        f"{_tokens(r['external_hit_tokens'])} of {_tokens(r['prompt_tokens'])} prompt tokens "
        "from the pool"
        for r in slower.iter_rows(named=True)
    ]
    return [
        Paragraph(
            "Pool overhead: these turns are surely slower with the shared cache on than "
            "recomputing (one-sided tests, Holm-corrected over the later turns the pool "
            "served): " + "; ".join(parts) + ". A pool hit that small costs its lookup and "
            "transfer and saves little prefill.",
            warning=True,
        )
    ]


def _tokens(value: float | None) -> str:
    return "no" if value is None else f"{value:,.0f}"


def _fidelity(run: Run, f: Frames) -> list[Element]:
    """The measurement-error table of a simulated run (nothing for real targets)."""
    if f.error.is_empty() or not run.simulated:
        return []
    return [
        Heading("Measurement error (simulated target)"),
        Paragraph(
            "Client TTFT minus the simulator's own modeled TTFT, per arm and turn, in "
            f"{run.seconds}: the client's and the simulator's lateness"
            f"{' divided by the time scale' if run.modeled else ''}. Cells above "
            f"{analysis.ERROR_SHARE:.0%} of their median TTFT are flagged."
        ),
        _show(
            f.error,
            "placement",
            "cache",
            "context_tokens",
            "turn",
            "n",
            "median_ttft_s",
            "median_modeled_s",
            "median_error_s",
            "p90_error_s",
            "error_share",
            "flagged",
        ),
    ]


def _drift_table(drift: pl.DataFrame) -> Table:
    return _show(
        drift,
        "placement",
        "cache",
        "context_tokens",
        "turn",
        "n_units",
        "drift",
        "effect",
        "arm_drift",
        "arm_drift_ci_low",
        "arm_drift_ci_high",
        "status",
    )


def _details(f: Frames, figures: dict[str, Path]) -> list[Element]:
    cells = ("placement", "cache", "context_tokens", "turn")
    return [
        Heading("Median TTFT per arm and turn"),
        Image(figures["median_ttft"], "median TTFT per turn per arm, log axis"),
        _show(
            f.arm,
            *cells,
            "n",
            "errors",
            "median_ttft_s",
            "ci_low_s",
            "ci_high_s",
            "p90_ttft_s",
            "median_e2e_s",
            "median_queue_s",
        ),
        Heading("TTFT distributions"),
        Image(figures["ttft_cdf"], "TTFT CDF per arm"),
        Heading("Cross-replica and same-replica turns (turns 2 and later)"),
        _show(
            f.cross,
            "placement",
            "context_tokens",
            "cross_replica",
            "turn",
            "median_off_s",
            "median_on_s",
            "speedup",
            "speedup_ci_low",
            "speedup_ci_high",
        ),
        Heading("Cold first turns"),
        _show(
            f.cold,
            "placement",
            "cache",
            "context_tokens",
            "n",
            "median_ttft_s",
            "ci_low_s",
            "ci_high_s",
            "max_cached_tokens",
            "contamination",
        ),
        Heading("Whole sessions (complete sessions, total end-to-end time)"),
        _show(
            f.sessions.rename(
                {
                    "speedup": "session_gain",
                    "speedup_ci_low": "session_gain_low",
                    "speedup_ci_high": "session_gain_high",
                }
            ),
            "placement",
            "context_tokens",
            "n_off",
            "n_on",
            "median_off_s",
            "median_on_s",
            "session_gain",
            "session_gain_low",
            "session_gain_high",
        ),
        Heading("Block drift (last block / first block of each arm, per turn)"),
        _drift_table(f.drift),
        Heading("Cache attribution (mean tokens per request)"),
        Image(figures["cache_attribution"], "local and external hit tokens per turn and arm"),
        _show(
            f.attribution.with_columns(pl.col(TOKEN_MEANS).round(0).cast(pl.Int64)),
            *cells,
            "prompt_tokens",
            "cached_tokens",
            "local_hit_tokens",
            "external_hit_tokens",
            "hit_fraction",
            "attributed",
            "contamination",
        ),
    ]


def _plain(value: Any) -> str:
    """Scalars as text, nested values as compact JSON."""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return format_value(value)


def _mapping_table(data: Mapping[str, object]) -> Table:
    rows = [{"key": str(k), "value": _plain(v)} for k, v in data.items()]
    return Table(pl.DataFrame(rows, schema={"key": pl.String(), "value": pl.String()}))


def _overhead(run: Run) -> list[Element]:
    out: list[Element] = []
    for key, title in (
        ("calibration", "Client overhead (calibration)"),
        ("loop_lag", "Event-loop lag"),
    ):
        value = run.manifest.get(key)
        if key == "calibration" and isinstance(value, dict) and "verdict" in value:
            # As `sessiongen calibrate` prints it: the verdict, then the figures grouped,
            # every tail with its sample count (older manifests: their table as written).
            out += [
                Heading(title),
                Paragraph(f"Verdict: {calibration_verdict(value)}."),
                Paragraph(DEFINITION),
                Bullets(tuple(figure_lines(value))),
            ]
        elif value:
            out += [
                Heading(title),
                _mapping_table(value if isinstance(value, dict) else {key: value}),
            ]
    return out


def _method(run: Run, boot: Bootstrap, logprob_tol: float) -> list[Element]:
    return [
        Heading("Method"),
        Bullets(
            (
                _durations(run),
                "Rows: warm-up requests excluded; requests with status other than ok counted as "
                "errors and excluded from latency statistics.",
                f"Intervals: {boot.method()} (Efron & Tibshirani 1993). Intervals resample "
                "sessions, each with all its blocks: per-arm intervals within the arm, speedup "
                "intervals in both arms at once when both replay the same sessions (paired), "
                "else each arm on its own. With fewer than "
                f"{MIN_SESSIONS} sessions per arm they cover less than stated "
                "(bench/interval_coverage.py; docs/concepts/statistics.md).",
                _contamination_method(run),
                "Correctness: answers are compared only between requests that sent the same "
                "prompt (prompt_digest), and counted against the OFF arm: a cache failure is "
                "an ON answer wrong where OFF was right (needles), or whose token ids differ "
                "from OFF's or whose first-token logprob is further than "
                f"{logprob_tol:g} from OFF's (equivalence). OFF answers that disagree or miss "
                "are a model limit; a pass needs ON answers served from the shared pool "
                "(external hits on cross-replica turns). The divergence rate is the share of "
                "compared ON answers whose token ids differ from OFF's.",
                "Block drift: per session and turn, TTFT last block / first block of each arm. "
                "Tested per arm: the mean over sessions of each session's mean log ratio, with a "
                "Student t interval, Bonferroni-adjusted over the arms; checked only with at "
                f"least {analysis.DRIFT_MIN_UNITS} sessions in both blocks. A turn is flagged "
                f"when its arm's drift is significant and beyond {analysis.DRIFT_MIN:.0%}, and "
                "the turn's drift (geometric mean over sessions) is larger than that turn's "
                "ON/OFF speedup.",
                "summary.csv: one row per placement, cache and turn; its speedup is the "
                "turn's (median TTFT OFF / ON of that turn), filled on cache=on rows only. "
                "decision.csv: the decision's rows under the names a plan's whatif.parquet "
                "gives them (session_gain, later_gain, later_turn_gain = the median "
                "per-turn gain, verdict, pays_at).",
            )
        ),
    ]


def _identity(run: Run) -> list[Element]:
    m = run.manifest
    keys = (
        "run_id",
        "scenario_name",
        "scenario_digest",
        "seed",
        "salt",
        "tokenizer",
        "text_generator",
        "tool",
        "target",
        "host",
        "started_at",
        "ended_at",
        "complete",
    )
    return [Heading("Run identity"), _mapping_table({k: m.get(k) for k in keys if k in m})]


def build_blocks(
    run: Run,
    frames: Frames,
    figures: dict[str, Path],
    boot: Bootstrap,
    *,
    decision: Sequence[Element] = (),
    load: Sequence[Element] = (),
    reuse: Sequence[Element] = (),
) -> list[Element]:
    """The report as document blocks, its sections in reading order: the ``decision``
    first (none given: none shown), then limits and problems, the routers, a load run's
    ``load`` headline and a trace's ``reuse`` (what the trace allows, before the headline
    of what the pool bought), the per-turn curve, and the details."""
    sections: list[Sequence[Element]] = [
        _header(run),
        decision,
        _limits(run, frames),
        _problems(run, frames),
        routing_section(run, boot),
        load,
        reuse,
        _headline(run, frames, figures, boot),
        _details(frames, figures),
        _fidelity(run, frames),
        _overhead(run),
        _method(run, boot, frames.equivalence.logprob_tol),
        _identity(run),
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
        load=load_section(whole, out, note, boot) if is_load_run(run) else (),
        reuse=reuse_section(run, out, note) if run.trace else (),
    )
    _point_to_problems(blocks)
    atomic_write_bytes(out / "report.md", to_markdown(blocks, out).encode())
    html = to_html(blocks, f"sessiongen report: {run.run_id}")
    atomic_write_bytes(out / "report.html", html.encode())
    cautions = json.dumps(report_cautions(blocks), indent=2) + "\n"
    atomic_write_bytes(out / CAUTIONS_FILE, cautions.encode())
    return out / "report.md"


#: The decision's rows as data: what-if column names (``WHATIF_COLUMNS``), one row per cell.
DECISION_FILE = "decision.csv"
DECISION_COLUMNS = (
    "placement",
    "context_tokens",
    "load_level",
    "session_gain",
    "session_gain_low",
    "session_gain_high",
    "sessions",
    "later_gain",
    "later_gain_low",
    "later_gain_high",
    "later_turn_gain",
    "stable_off",
    "stable_on",
    "pays_at",
    "verdict",
)


def decision_frame(d: Decision) -> pl.DataFrame:
    """``decision.csv``: the decision's rows under their what-if names."""
    return d.rows.select(c for c in DECISION_COLUMNS if c in d.rows.columns)


def _point_to_problems(blocks: list[Element]) -> None:
    """Right after the decision's table, a warning that the Problems or Limits below
    bear on it, when the report has any (the answer first, never without its caveats)."""
    cautions = report_cautions(blocks)
    parts = [
        f"the {len(found)} {kind if len(found) > 1 else kind[:-1]} under {title}"
        for kind, title, found in (
            ("problems", "Problems", cautions["problems"]),
            ("limits", LIMITS, cautions["limits"]),
        )
        if found
    ]
    start = next(
        (
            i
            for i, b in enumerate(blocks)
            if isinstance(b, Heading) and b.text.startswith("Decision")
        ),
        None,
    )
    if not parts or start is None:
        return
    end = next(
        (i for i in range(start + 1, len(blocks)) if isinstance(blocks[i], Heading)), len(blocks)
    )
    at = next((i for i in range(start + 1, end) if isinstance(blocks[i], Table)), end - 1)
    text = f"Read these verdicts with {' and '.join(parts)}, below."
    blocks.insert(at + 1, Paragraph(text, warning=True))


#: The report's Problems and Limits as data (``report/cautions.json``), for the nightly
#: summary and the notebook: what the report leads with, said the same everywhere.
CAUTIONS_FILE = "cautions.json"
CAUTION_SECTIONS = {"Problems": "problems", LIMITS: "limits"}


def report_cautions(blocks: list[Element]) -> dict[str, list[str]]:
    """The warning paragraphs under the report's Problems and Limits headings."""
    out: dict[str, list[str]] = {name: [] for name in CAUTION_SECTIONS.values()}
    section = None
    for block in blocks:
        if isinstance(block, Heading) and block.level <= 2:
            section = CAUTION_SECTIONS.get(block.text)
        elif section and isinstance(block, Paragraph) and block.warning:
            out[section].append(block.text)
    return out


def run_cautions(
    run_dir: str | Path, *, boot: Bootstrap = DEFAULT_BOOTSTRAP
) -> dict[str, list[str]]:
    """A run's Problems and Limits as its report states them: read from its
    ``report/cautions.json`` where a report was written, else computed the same way
    (:func:`build_blocks`, nothing written). The notebook shows these."""
    written = read_cautions(Path(run_dir) / "report")
    if written is not None:
        return written
    run = load_run(run_dir).levels_apart()
    figures = {name: Path(f"{name}.png") for name in plots.FIGURE_NAMES}  # not drawn
    return report_cautions(build_blocks(run, Frames.compute(run, boot), figures, boot))


def read_cautions(report_dir: Path) -> dict[str, list[str]] | None:
    """A written report's Problems and Limits (None for reports written before them)."""
    path = report_dir / CAUTIONS_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: [str(t) for t in data.get(name, [])] for name in CAUTION_SECTIONS.values()}
