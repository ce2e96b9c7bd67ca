"""The report's Limits, Problems and Notes: what the run is too small to show, what makes
its figures unreadable (arms that differ beyond the cache, measurement error, late
arrivals, mislabeled arms, correctness, contamination, errors, drift, lag), said first.
"""

from __future__ import annotations

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.drift import not_checked
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.payoff import verdict
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run
from sessiongen.report.correctness import basis_note, correctness_passed, correctness_problems
from sessiongen.report.document import (
    Element,
    Heading,
    Paragraph,
    Table,
)
from sessiongen.report.frames import Frames, drift_table, show

LIMITS = "Limits of this run"


def limits_section(run: Run, f: Frames) -> list[Element]:
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
        out.append(show(errors, "placement", "cache", "context_tokens", "turn", "errors", "n"))
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
        out.append(drift_table(flagged))
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
            show(moved, *CELL_KEYS, "n", "lagged", "median_ttft_s", "median_unlagged_s", "shift"),
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


def _error_text(run: Run, f: Frames) -> str | None:
    """The measurement error's sentence, where a cell's is above its threshold."""
    errors = f.error.filter(pl.col("flagged"))
    if errors.is_empty():
        return None
    worst = errors.sort(pl.col("error_share").abs(), descending=True).row(0, named=True)
    return (
        f"Measurement error above {analysis.ERROR_SHARE:.0%} of the median TTFT in "
        f"{errors.height} of {f.error.height} cells (worst {worst['error_share']:+.1%}: "
        f"{worst['placement']}/{worst['cache']} turn {worst['turn']}). The client's "
        "and the simulator's own lateness, divided by the time scale, is that large "
        "a part of what was measured"
    )


def error_moves_verdict(error: pl.DataFrame, verdicts: pl.DataFrame | None) -> bool:
    """Whether the measurement error could move a verdict: True unless every decision
    row keeps its verdict with its gain's interval shifted either way by the most its
    placement's worst error allows, (1 + e) / (1 - e) with e that error's share of a
    cell's median TTFT (each arm's TTFT off by e in opposite directions; a session's
    end-to-end time, the session gain's measure, is off by less). No rows: True."""
    if verdicts is None or verdicts.is_empty() or "pays_at" not in verdicts.columns:
        return True
    worst = error.group_by("placement").agg(pl.col("error_share").abs().max().alias("e"))
    shares = dict(worst.iter_rows())
    for r in verdicts.iter_rows(named=True):
        e = min(float(shares.get(r["placement"]) or 0.0), 0.5)
        low, high, pays_at = r["session_gain_low"], r["session_gain_high"], r["pays_at"]
        if low is None or high is None:
            continue  # no interval: no verdict the error could move
        factor = (1 + e) / (1 - e)
        given = verdict(low, high, pays_at)
        if any(verdict(low * k, high * k, pays_at) != given for k in (factor, 1 / factor)):
            return True
    return False


def _error_note(run: Run, f: Frames, moves: bool) -> list[Element]:
    """The measurement error that cannot move a verdict: a note, not a problem (the quick
    start's report put a 2.1% error in one cell over a verdict of 1.82 [1.82, 1.82])."""
    text = _error_text(run, f)
    if text is None or moves:
        return []
    return [
        Paragraph(
            f"{text}. It moves no verdict: each one holds with its session gain's interval "
            "shifted either way by as much as that error allows; the flagged cells' own "
            f"figures carry it ({analysis.time_scale_remedy(run)} to shrink it)."
        )
    ]


def _trust_problems(run: Run, f: Frames, error_moves: bool) -> list[Element]:
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
            show(
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
    text = _error_text(run, f)
    if text is not None and error_moves:
        out.append(Paragraph(text + f": {analysis.time_scale_remedy(run)}.", warning=True))
    late = analysis.late_arrivals(run)
    if late["flagged"].any():
        text = analysis.late_arrival_warning(run, late)
        assert text is not None  # a flagged cell has late requests
        out += [
            Paragraph(text, warning=True),
            show(
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
        show(bad, *[c for c in bad.columns if c != "evidence"]),
    ]


def problems_section(run: Run, f: Frames, verdicts: pl.DataFrame | None = None) -> list[Element]:
    """What makes figures unreadable, then Notes; ``verdicts``: the decision's rows, which
    a problem that cannot move any of them is a note beside (:func:`error_moves_verdict`)."""
    correct = correctness_problems(f.correctness, f.summary, f.divergences)
    passed = correctness_passed(f.correctness)
    basis = basis_note(f.correctness) if correct or passed else []
    moves = error_moves_verdict(f.error, verdicts)  # the error: a problem, or a note
    found = (
        _trust_problems(run, f, moves)
        + _arm_problems(run)
        + correct
        + _measurement_problems(run, f)
    )
    if not found:
        found = [
            Paragraph(
                "None found: no cache failures, no contamination, no request "
                f"errors, {_drift_summary(f)}."
            )
        ]
    notes = [*passed, *basis, *_lag_note(f), *_error_note(run, f, moves)]
    return [Heading("Problems"), *found, *([Heading("Notes"), *notes] if notes else [])]
