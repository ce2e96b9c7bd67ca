"""The run described: the report's header, the client's overhead, the method and the run's
identity.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.stats import MIN_SESSIONS, Bootstrap
from sessiongen.calibrate.verdict import DEFINITION, figure_lines
from sessiongen.calibrate.verdict import verdict as calibration_verdict
from sessiongen.records.run import Run
from sessiongen.report.document import (
    Bullets,
    Element,
    Heading,
    Paragraph,
    Table,
    format_value,
)


def header_section(run: Run) -> list[Element]:
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


def _plain(value: Any) -> str:
    """Scalars as text, nested values as compact JSON."""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return format_value(value)


def _mapping_table(data: Mapping[str, object]) -> Table:
    rows = [{"key": str(k), "value": _plain(v)} for k, v in data.items()]
    return Table(pl.DataFrame(rows, schema={"key": pl.String(), "value": pl.String()}))


def overhead_section(run: Run) -> list[Element]:
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


def method_section(run: Run, boot: Bootstrap, logprob_tol: float) -> list[Element]:
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


def identity_section(run: Run) -> list[Element]:
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
