"""The run report: ``RUN_DIR/report/`` with report.md, report.html, summary.csv and plots.

:func:`write_report` loads a run (:func:`load_run`, re-exported here), computes the
analysis frames once, draws the figures, and writes:

- ``report.md`` and a self-contained ``report.html`` (images embedded as base64). They
  show **problems first** (correctness failures: wrong needle answers, and for the
  ``equivalence`` probe the divergence rate, the largest first-token logprob difference
  and the worst case; then contamination, request errors, block drift larger than a
  turn's effect, incomplete blocks), after the **limits** of a run too small for its
  statistics (:func:`sessiongen.analysis.interval_warnings`: too few sessions for the
  intervals, block drift not checked); then the headline speedup curves, the details,
  the method and the run's identity;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.checks import WORST_ROW_COLUMNS, Equivalence
from sessiongen.analysis.drift import not_checked
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, MIN_SESSIONS, Bootstrap
from sessiongen.infra.files import atomic_write_bytes
from sessiongen.records.run import Run, load_run
from sessiongen.report import plots
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

__all__ = ["SUMMARY_COLUMNS", "Run", "load_run", "summary_frame", "write_report"]

SUMMARY_COLUMNS = (
    "placement",
    "cache",
    "turn",
    "n",
    "median_ttft_s",
    "ci_low_s",
    "ci_high_s",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
)


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
    equivalence: Equivalence

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
            equivalence=analysis.equivalence(run, logprob_tol=logprob_tol),
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
                if run.simulated
                else "All durations are measured seconds. "
            )
            + f"{run.requests.height} requests analysed; "
            f"{run.warmup_rows} warm-up requests excluded."
        ),
    ]
    if run.simulated:
        blocks.append(Paragraph("SIMULATED target: the replicas were the embedded simulator."))
    if meta.complete is False:
        blocks.append(Paragraph("This run is INCOMPLETE (complete: false).", warning=True))
    return blocks


def _correctness_problems(run: Run, f: Frames) -> list[Element]:
    out: list[Element] = []
    wrong = f.needles.filter(pl.col("rate") < 1)
    if not wrong.is_empty():
        total = int((wrong["graded"] - wrong["correct"]).sum())
        out += [Paragraph(f"Correctness: {total} needle answers wrong.", warning=True)]
        out.append(
            _show(
                wrong, "placement", "cache", "context_tokens", "turn", "graded", "correct", "rate"
            )
        )
    if run.probe == "equivalence":
        return out + _equivalence_problems(f)
    diverged = f.divergences.filter(pl.col("diverged"))
    if not diverged.is_empty():
        out.append(
            Paragraph(
                f"Note: outputs differ in {diverged.height} (session, turn) groups; this is not "
                "an equivalence run, so sampling or batching nondeterminism may explain it."
            )
        )
        out.append(_divergence_table(diverged))
    return out


def _divergence_table(diverged: pl.DataFrame) -> Table:
    return _show(
        diverged,
        "placement",
        "context_tokens",
        "session_id",
        "turn",
        "n",
        "n_digests",
        "arms_differ",
        "logprob_diff",
        "logprob_beyond_tol",
    )


def _diff_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _equivalence_problems(f: Frames) -> list[Element]:
    """The equivalence probe's failures: rate and worst case first, then the groups."""
    eq = f.equivalence
    if eq.compared == 0:
        return [
            Paragraph(
                "Equivalence: nothing to compare (no (session, turn) has two ok answers "
                "with digests), so this run cannot show a divergence.",
                warning=True,
            )
        ]
    if eq.vacuous:
        return [
            Paragraph(
                f"Equivalence probe is vacuous: all {eq.groups} (session, turn) got the same "
                "answer, so a wrong cache could not change it. The model's outputs must "
                "depend on the prompt.",
                warning=True,
            )
        ]
    if eq.diverged == 0 or eq.worst is None:
        return []
    worst = eq.worst
    where = (
        f"{worst['placement']}, context {worst['context_tokens']}, session "
        f"{worst['session_id']}, turn {worst['turn']}"
    )
    if worst["ids_differ"]:
        what = (
            f"{worst['n_digests']} different answers (OFF {worst['off_digests'] or '-'}; "
            f"ON {worst['on_digests'] or '-'})"
        )
    else:
        what = "the same token ids"
    rate = eq.rate or 0.0
    return [
        Paragraph(
            f"Correctness: answers diverged in {eq.diverged} of {eq.compared} (session, turn) "
            f"compared across cache arms and blocks. Token ids differ in {eq.ids_differ} "
            f"(divergence rate {rate:.1%}; {eq.arms_differ} between OFF and ON); first-token "
            f"logprobs differ by more than the tolerance {eq.logprob_tol:g} in "
            f"{eq.logprob_beyond_tol}. Largest first-token logprob difference: "
            f"{_diff_text(eq.max_logprob_diff)}.",
            warning=True,
        ),
        Paragraph(
            f"Worst case: {where}: {what}, first-token logprobs differ by "
            f"{_diff_text(worst['logprob_diff'])}. Its requests:",
            warning=True,
        ),
        Table(eq.worst_rows.select(WORST_ROW_COLUMNS)),
        Paragraph("All diverged (session, turn):"),
        _divergence_table(f.divergences.filter(pl.col("diverged"))),
    ]


def _equivalence_passed(run: Run, f: Frames) -> list[Element]:
    """For equivalence runs without failures: what was compared, so a pass is not silent."""
    eq = f.equivalence
    if run.probe != "equivalence" or eq.diverged or eq.compared == 0 or eq.vacuous:
        return []
    return [
        Paragraph(
            f"Equivalence: answers identical across cache arms and blocks in all {eq.compared} "
            f"(session, turn) compared ({eq.distinct_outputs} distinct answers); largest "
            f"first-token logprob difference {_diff_text(eq.max_logprob_diff)} (tolerance "
            f"{eq.logprob_tol:g})."
        )
    ]


def _limits(run: Run) -> list[Element]:
    """What the run is too small to show (sessions for the intervals, drift unchecked)."""
    warnings = analysis.interval_warnings(run)
    if not warnings:
        return []
    return [Heading("Limits of this run"), *(Paragraph(w, warning=True) for w in warnings)]


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
    lagged = int(run.requests["loop_lag_flag"].fill_null(False).sum())
    if lagged:
        out.append(Paragraph(f"{lagged} requests saw client event-loop lag > 5 ms.", warning=True))
    return out


def _problems(run: Run, f: Frames) -> list[Element]:
    found = _correctness_problems(run, f) + _measurement_problems(run, f)
    if not found:
        found = [
            Paragraph(
                "None found: no correctness failures, no contamination, no request "
                f"errors, {_drift_summary(f)}."
            )
        ]
    return [Heading("Problems"), *found, *_equivalence_passed(run, f)]


def _headline(f: Frames, figures: dict[str, Path], boot: Bootstrap) -> list[Element]:
    return [
        Heading("Headline: shared-cache speedup per turn"),
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
            f.sessions,
            "placement",
            "context_tokens",
            "n_off",
            "n_on",
            "median_off_s",
            "median_on_s",
            "speedup",
            "speedup_ci_low",
            "speedup_ci_high",
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


def _mapping_table(data: dict[str, Any]) -> Table:
    rows = [{"key": str(k), "value": _plain(v)} for k, v in data.items()]
    return Table(pl.DataFrame(rows, schema={"key": pl.String(), "value": pl.String()}))


def _overhead(run: Run) -> list[Element]:
    out: list[Element] = []
    for key, title in (
        ("calibration", "Client overhead (calibration)"),
        ("loop_lag", "Event-loop lag"),
    ):
        value = run.manifest.get(key)
        if value:
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
                f"Durations: modeled seconds = measured / time scale ({run.time_scale:g}).",
                "Rows: warm-up requests excluded; requests with status other than ok counted as "
                "errors and excluded from latency statistics.",
                f"Intervals: {boot.method()} (Efron & Tibshirani 1993). Intervals resample "
                "sessions, each with all its blocks: per-arm intervals within the arm, speedup "
                "intervals in both arms at once when both replay the same sessions (paired), "
                "else each arm on its own. With fewer than "
                f"{MIN_SESSIONS} sessions per arm they cover less than stated "
                "(bench/interval_coverage.py; README, Analysis).",
                "Contamination: turn-1 cached/local/external hit tokens above "
                f"{run.shared_prefix_tokens} (shared prefix), or external hits with the cache off.",
                "Equivalence (probe = equivalence): per placement, session and turn, the answers "
                "of all cache arms and blocks must have the same token ids (output_digest) and "
                "first-token logprobs within a tolerance for batching noise "
                f"({logprob_tol:g}); the divergence rate is the share of (session, "
                "turn) whose token ids differ.",
                "Block drift: per session and turn, TTFT last block / first block of each arm. "
                "Tested per arm: the mean over sessions of each session's mean log ratio, with a "
                "Student t interval, Bonferroni-adjusted over the arms; checked only with at "
                f"least {analysis.DRIFT_MIN_UNITS} sessions in both blocks. A turn is flagged "
                f"when its arm's drift is significant and beyond {analysis.DRIFT_MIN:.0%}, and "
                "the turn's drift (geometric mean over sessions) is larger than that turn's "
                "ON/OFF speedup.",
                "summary.csv: speedup columns are filled on cache=on rows only.",
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
    run: Run, frames: Frames, figures: dict[str, Path], boot: Bootstrap
) -> list[Element]:
    """The report as document blocks, problems first."""
    return [
        *_header(run),
        *_limits(run),
        *_problems(run, frames),
        *_headline(frames, figures, boot),
        *_details(frames, figures),
        *_overhead(run),
        *_method(run, boot, frames.equivalence.logprob_tol),
        *_identity(run),
    ]


def write_report(
    run_dir: str | Path,
    *,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
    logprob_tol: float = analysis.LOGPROB_TOL,
) -> Path:
    """Write ``RUN_DIR/report/`` (see the module docstring); return the report.md path.

    ``logprob_tol`` is the equivalence probe's tolerance on first-token logprob
    differences (:data:`sessiongen.analysis.checks.LOGPROB_TOL`).
    """
    run = load_run(run_dir)
    out = run.path / "report"
    out.mkdir(exist_ok=True)
    frames = Frames.compute(run, boot, logprob_tol)
    figures = plots.write_figures(
        run, out, speedups=frames.speedup, arm_table=frames.arm, attribution=frames.attribution
    )
    atomic_write_bytes(out / "summary.csv", summary_frame(frames.summary).write_csv().encode())
    blocks = build_blocks(run, frames, figures, boot)
    atomic_write_bytes(out / "report.md", to_markdown(blocks, out).encode())
    html = to_html(blocks, f"sessiongen report: {run.run_id}")
    atomic_write_bytes(out / "report.html", html.encode())
    return out / "report.md"
