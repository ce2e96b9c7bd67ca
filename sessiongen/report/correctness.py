"""The report's correctness section: each probe's verdict first, then what it rests on.

Verdicts (:mod:`sessiongen.analysis.correctness`): **cache failure** (pool-served ON
answers wrong where OFF was right on the same prompt, more often than the noise baseline
allows: the only failure, and why ``replay`` exits 1), **within noise** (pool-served
divergences no more frequent than where the pool had no part), **vacuous**
(every prompt got one answer), **OFF inconsistent** (the OFF arm disagrees with itself or
misses: a model limit), **not exercised** (no ON request served from the shared pool was
compared with OFF: the run says nothing about the cache) and **passed**. ON-only
disagreements (no OFF answer to tell) are shown beside them, never as failures.
"""

from __future__ import annotations

import polars as pl

from sessiongen.analysis.correctness import (
    DIVERGED,
    NOT_EXERCISED,
    OFF_INCONSISTENT,
    PASSED,
    WITHIN_NOISE,
)
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.prompts import BASIS_DIGEST
from sessiongen.analysis.verdicts import (
    WORST_ROW_COLUMNS,
    Correctness,
    Equivalence,
    Needles,
    not_exercised_reason,
)
from sessiongen.report.document import Element, Paragraph, Table

EVIDENCE = {
    "request": "pool use counted per request",
    "block": (
        "pool use known per block only: per-request counters are exact only at "
        "driver.concurrency = 1, so a cross-replica ON request counts as pool-served when "
        "its block's external-hit counters rose"
    ),
    "none": "pool use unknown (no external-hit counters)",
}


def _diff(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _cells(summary: pl.DataFrame, column: str, *extra: str) -> Table:
    """The summary's cells where ``column`` is nonzero."""
    rows = summary.filter(pl.col(column) > 0)
    keys = ("placement", "cache", "context_tokens", "turn")
    return Table(drop_single_context(rows.select(*keys, *extra, column)))


def basis_note(c: Correctness) -> list[Element]:
    """Say how prompts were matched when it is not by digest (older runs)."""
    if c.basis == BASIS_DIGEST and not c.unkeyed:
        return []
    left = f"; {c.unkeyed} requests could be matched with nothing" if c.unkeyed else ""
    return [Paragraph(f"Prompts were matched by {c.basis}{left}.")]


def needle_problems(c: Correctness, summary: pl.DataFrame) -> list[Element]:
    """The needle probe: cache failures, OFF misses, ON-only misses, not exercised."""
    n = c.needles
    if not n.graded and not n.off_wrong:
        return []
    out: list[Element] = []
    if n.failures:
        out += [
            Paragraph(
                f"Correctness (cache failure): {n.failures} pool-served needle answers wrong "
                "in the ON arm where the OFF arm answered the same prompt right, more often "
                f"than the noise allows: {n.baseline.text()}.",
                warning=True,
            ),
            _cells(summary, "cache_failures", "needle_graded", "needle_correct"),
        ]
    elif n.verdict == WITHIN_NOISE:
        out += [
            Paragraph(
                f"Needles within noise: {n.baseline.text()}. Not a cache failure at this "
                "level; more sessions would tell.",
                warning=True,
            ),
            _cells(summary, "pool_divergences", "needle_graded", "needle_correct"),
        ]
    if n.off_wrong:
        out += [
            Paragraph(
                f"Needles, OFF inconsistent: {n.off_wrong} prompts missed with the cache off "
                "(a model limit, not a cache fault); their ON answers are not judged."
            ),
            _cells(summary, "off_inconsistent", "needle_graded", "needle_correct"),
        ]
    out += _needle_on_only(n, summary)
    if n.verdict == NOT_EXERCISED:
        reason = not_exercised_reason(n, has_off=c.has_off)
        out.append(Paragraph(f"Needle probe not exercised: {reason}.", warning=True))
    return out


def _needle_on_only(n: Needles, summary: pl.DataFrame) -> list[Element]:
    if not n.on_only:
        return []
    return [
        Paragraph(
            f"Needles, ON only: {n.on_only} prompts missed in the ON arm that no OFF request "
            "sent, so a model limit cannot be told from a cache fault (not counted as cache "
            "failures).",
            warning=True,
        ),
        _cells(summary, "on_only", "needle_graded", "needle_correct"),
    ]


def equivalence_problems(c: Correctness, divergences: pl.DataFrame) -> list[Element]:
    """The equivalence probe: its verdict first (rate, largest difference, worst case)."""
    eq = c.equivalence
    if eq.prompts == 0:
        return [
            Paragraph(
                "Equivalence: nothing to compare (no ok answers with digests), so this run "
                "cannot show a cache failure.",
                warning=True,
            )
        ]
    if eq.vacuous:
        return [
            Paragraph(
                f"Equivalence probe is vacuous: all {eq.prompts} prompts got the same answer, "
                "so a wrong cache could not change it. The model's outputs must depend on "
                "the prompt.",
                warning=True,
            )
        ]
    out = _equivalence_failures(eq, divergences) if eq.baseline.pool_diverged else []
    out += _off_inconsistent(eq)
    out += _on_only(eq)
    if eq.verdict == NOT_EXERCISED:
        reason = not_exercised_reason(eq, has_off=c.has_off)
        out.append(
            Paragraph(
                f"Equivalence not exercised: {reason}. No ON answer served from the shared "
                "pool was compared with an OFF answer to the same prompt, so this run says "
                f"nothing about the cache's answers ({eq.no_reference} ON answers had no OFF "
                "answer to compare with).",
                warning=True,
            )
        )
    return out


def _equivalence_failures(eq: Equivalence, divergences: pl.DataFrame) -> list[Element]:
    worst = eq.worst
    if worst is None:  # failures imply a compared request; nothing to show otherwise
        return []
    where = (
        f"{worst.placement}, context {worst.context_tokens}, session "
        f"{worst.session_id}, turn {worst.turn}, block {worst.block}"
    )
    what = (
        f"answer {worst.output_digest} where OFF answered {worst.off_digests}"
        if worst.ids_differ
        else "the same token ids as OFF"
    )
    failing = divergences.filter(pl.col("verdict") == DIVERGED)
    head = (
        "Correctness (cache failure): the pool-served answers differ from OFF more often "
        "than the noise allows"
        if eq.failures
        else "Equivalence within noise: pool-served answers differ from OFF, but no more "
        "often than where the pool had no part (not a cache failure at this level; more "
        "sessions would tell)"
    )
    return [
        Paragraph(
            f"{head}: {eq.baseline.text()}. Of all {eq.compared} ON answers compared, token "
            f"ids differ in {eq.ids_differ} (divergence rate {eq.rate or 0.0:.1%}); "
            f"first-token logprobs further than the tolerance {eq.logprob_tol:g} from OFF's "
            f"in {eq.logprob_beyond_tol}. Largest first-token logprob difference from OFF: "
            f"{_diff(eq.max_logprob_diff)}.",
            warning=True,
        ),
        Paragraph(
            f"Worst case: {where}: {what}, first-token logprob {_diff(worst.logprob_diff)} "
            "from OFF's. Every request that sent its prompt:",
            warning=True,
        ),
        Table(eq.worst_rows.select(WORST_ROW_COLUMNS)),
        Paragraph("All ON answers that differ from OFF's:"),
        Table(
            drop_single_context(
                failing.select(
                    "placement",
                    "context_tokens",
                    "session_id",
                    "turn",
                    "block",
                    "pool_served",
                    "ids_differ",
                    "logprob_diff",
                )
            )
        ),
    ]


def _prompt_rows(eq: Equivalence, flag: str) -> Table:
    rows = eq.prompt_table.filter(pl.col(flag))
    off = ("off_n", "off_n_digests", "off_lp_spread")
    on = ("on_n", "on_n_digests", "on_lp_spread")
    return Table(
        drop_single_context(rows.select("context_tokens", "session_id", "turn", *off, *on))
    )


def _off_inconsistent(eq: Equivalence) -> list[Element]:
    if not eq.off_inconsistent:
        return []
    rest = (
        f" The other {eq.compared} ON answers compared with OFF agreed "
        f"({eq.exercised} served from the shared pool)."
        if eq.compared and not eq.failures
        else ""
    )
    return [
        Paragraph(
            f"Equivalence, OFF inconsistent: the OFF answers to {eq.off_inconsistent} prompts "
            "disagree among themselves (the model or its numerics, not the cache); the ON "
            f"answers to them are not judged.{rest}",
            warning=eq.verdict == OFF_INCONSISTENT,
        ),
        _prompt_rows(eq, "off_inconsistent"),
    ]


def _on_only(eq: Equivalence) -> list[Element]:
    if not eq.on_only:
        return []
    return [
        Paragraph(
            f"Equivalence, ON only: the ON answers to {eq.on_only} prompts disagree among "
            "themselves and no OFF request sent them, so a model limit cannot be told from "
            "a cache fault (not counted as cache failures).",
            warning=True,
        ),
        _prompt_rows(eq, "on_only"),
    ]


def other_outputs(divergences: pl.DataFrame) -> list[Element]:
    """Outside equivalence runs: ON outputs that differ from OFF's, as a note only."""
    diverged = divergences.filter(pl.col("verdict") == DIVERGED)
    if diverged.is_empty():
        return []
    return [
        Paragraph(
            f"Note: {diverged.height} ON outputs differ from the OFF output to the same "
            "prompt; this is not an equivalence run, so sampling or batching "
            "nondeterminism may explain it (not counted as cache failures)."
        )
    ]


def correctness_problems(
    c: Correctness, summary: pl.DataFrame, divergences: pl.DataFrame
) -> list[Element]:
    """Everything about correctness that belongs under Problems, verdicts first."""
    out = needle_problems(c, summary)
    if c.probe == "equivalence":
        out += equivalence_problems(c, divergences)
    else:
        out += other_outputs(divergences)
    return out


def correctness_passed(c: Correctness) -> list[Element]:
    """Probes that passed: what was compared, so a pass is never silent or overstated."""
    out: list[Element] = []
    n = c.needles
    if n.verdict == PASSED and n.graded:
        out.append(
            Paragraph(
                f"Needles passed: all {n.compared} ON answers judged against the OFF answer "
                f"to the same prompt were right; {n.exercised} of them were served from the "
                f"shared pool ({EVIDENCE[n.evidence]})."
            )
        )
    eq = c.equivalence
    if c.probe == "equivalence" and eq.verdict == PASSED:
        agreed = (
            f"all {eq.compared} ON answers compared with the OFF answer to the same prompt agreed"
            if not eq.divergent
            else f"all {eq.exercised} pool-served ON answers agreed with the OFF answer to "
            f"the same prompt, while {eq.divergent} of the others differ (the noise "
            f"baseline: {eq.baseline.base_diverged} of {eq.baseline.base_compared})"
        )
        out.append(
            Paragraph(
                f"Equivalence passed: {agreed} (token ids identical, first-token logprobs "
                f"within {eq.logprob_tol:g} of OFF's); {eq.exercised} of {eq.compared} "
                f"compared were served from the shared pool ({EVIDENCE[eq.evidence]}). "
                f"Largest first-token logprob difference from OFF: "
                f"{_diff(eq.max_logprob_diff)}; {eq.distinct_outputs} distinct answers over "
                f"{eq.prompts} prompts."
            )
        )
    return out
