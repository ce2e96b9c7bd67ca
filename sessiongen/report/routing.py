"""The report's section on routers: shown when a run has routed placements.

Its headline answers the question platform engineers ask of a router: per placement or
router policy, how often did sessions change replica, what did the shared pool buy per
turn and per session, and does that gain survive the router? Then how the serving
replica of each routed turn was found, and which router processes served the blocks.
Definitions are in :mod:`sessiongen.analysis.routing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from sessiongen.analysis import SESSION_GAIN, routing
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.stats import Bootstrap
from sessiongen.records.run import Run
from sessiongen.report.document import Element, Heading, Paragraph, Table

#: Routed requests whose serving replica is unknown beyond this share are called out.
UNKNOWN_SHARE = 0.10


def _verdicts(headline: pl.DataFrame) -> str:
    parts = []
    for r in headline.iter_rows(named=True):
        moved = "-" if r["moved_share"] is None else f"{r['moved_share']:.0%}"
        verdict = {True: "survives", False: "does not survive", None: "cannot be told"}[
            r["survives"]
        ]
        parts.append(
            f"{r['kind']} {r['placement']}: {moved} of turns changed replica, the pool's "
            f"gain {verdict}"
        )
    return "; ".join(parts) + "." if parts else ""


def _unknown_warning(moves: pl.DataFrame) -> list[Element]:
    routed = moves.filter(pl.col("routed"))
    total = int(routed["requests"].sum())
    known = int(routed["known"].sum())
    if not total or (total - known) / total <= UNKNOWN_SHARE:
        return []
    return [
        Paragraph(
            f"The serving replica is unknown for {total - known} of {total} routed requests "
            f"({(total - known) / total:.0%}): nothing named it in the response and the "
            "counters could not tell (concurrency above 1, or replicas' /metrics not "
            "reachable). Their turns are left out of the moved share.",
            warning=True,
        )
    ]


def _router_rows(blocks: tuple[Mapping[str, Any], ...]) -> pl.DataFrame:
    rows = [
        {
            "block": b.get("block"),
            "placement": b.get("placement"),
            "cache": b.get("cache"),
            "policy": b["router"].get("policy"),
            "version": b["router"].get("version"),
            "startup_s": b["router"].get("startup_s"),
            "stop": b["router"].get("stop"),
            "log": b["router"].get("log"),
        }
        for b in blocks
        if isinstance(b.get("router"), dict)
    ]
    schema = {
        "block": pl.Int64(),
        "placement": pl.String(),
        "cache": pl.String(),
        "policy": pl.String(),
        "version": pl.String(),
        "startup_s": pl.Float64(),
        "stop": pl.String(),
        "log": pl.String(),
    }
    return pl.DataFrame(rows, schema=schema)


def routing_section(run: Run, boot: Bootstrap) -> list[Element]:
    """The routers section (empty when no placement was routed)."""
    if not routing.has_routed(run):
        return []
    headline = routing.routing_headline(run, boot=boot)
    moves = routing.replica_moves(run)
    seconds = run.seconds
    out: list[Element] = [
        Heading("Headline: placements, routers and the shared pool"),
        *_unknown_warning(moves),
        Paragraph(_verdicts(headline)),
        Paragraph(
            "Per placement: 'client' placements were chosen by sessiongen, 'router' ones by "
            "the router. moved_share = share of turns 2+ that ran on another replica than "
            "the session's previous turn, from the replicas that served them (never "
            "assumed from the policy); known_share = share of requests whose serving "
            "replica is known. turn_gain = median TTFT off / on over turns 2+ pooled "
            "(the typical later turn), with its range over single turns and best_turn, "
            f"where the pool mattered most; session_gain = {SESSION_GAIN}; survives = the "
            "session gain's interval lies above "
            f"{1 + routing.MIN_GAIN:g} (smaller gains are within the routers' own "
            "block-to-block noise). "
            f"added_s = median client TTFT minus the replica's own, {seconds}: what the "
            "client and any router added (simulated targets only; under time compression "
            "a router's wall milliseconds count 1 / time scale times)."
        ),
        Table(drop_single_context(headline)),
        Heading("How the serving replica was found"),
        Paragraph(
            "replica_source per arm: 'placement' (the client sent the turn to it), "
            "'header' or 'fingerprint' (the response named it), 'counters' (at "
            "concurrency 1 only that replica's prefill counters moved), joined with '+' "
            "where methods agreed; 'unknown' and 'conflict' leave the replica null."
        ),
        Table(drop_single_context(moves)),
    ]
    routers = _router_rows(run.meta.blocks)
    if not routers.is_empty():
        out += [Heading("Routers started (one per routed block)"), Table(routers)]
    return out
