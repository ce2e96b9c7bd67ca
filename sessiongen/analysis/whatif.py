"""The what-if table's names: what each column means, the ``--vary`` options and the
configurations they give.

A plan's ``whatif.parquet`` and a replay's decision share these columns; the planner
(:mod:`sessiongen.capacity`) writes them and the report (:mod:`sessiongen.report.whatif`,
:mod:`sessiongen.report.decision`) prints them, each from here, so the two cannot drift
apart and neither imports the other. The configurations are built from a scenario file
by :func:`sessiongen.capacity.grid.configs`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from sessiongen.analysis.latency import SESSION_GAIN
from sessiongen.analysis.load import MAX_GROWTH, MIN_SERVED_SHARE
from sessiongen.errors import UserError
from sessiongen.scenario.spec import Scenario

#: What each what-if column means (one row per configuration, placement, context, level).
WHATIF_COLUMNS = {
    "session_gain": SESSION_GAIN,
    "session_gain_low": "lower end of the session gain's 95% interval: paired bootstrap "
    "over sessions (expanded percentile, Hesterberg 2015), every replicate's sessions pooled",
    "session_gain_high": "upper end of the session gain's 95% interval (same method)",
    "sessions": "sessions the session gain's interval resamples (replicates x sessions)",
    "later_gain": "median TTFT over turns 2.. OFF / ON, every replicate pooled",
    "later_gain_low": "lower end of the later-turn gain's 95% interval (paired bootstrap "
    "over sessions, a session's later turns one unit)",
    "later_gain_high": "upper end of the later-turn gain's 95% interval",
    "session_gain_seed_min": "smallest session gain of one replicate (seed, parameter draw)",
    "session_gain_seed_max": "largest session gain of one replicate (seed, parameter draw)",
    "replicates": "runs pooled per configuration (--seeds: arrival seeds, with the "
    "profile's parameter draws when it carries them)",
    "parameter_draws": "replicates planned with a bootstrap draw of the profile's fitted "
    "parameters ([[fit.draw]] in the profile file; 0 when it carries none)",
    "pays_at": "the threshold of --pays-at the verdict reads the session gain against",
    "verdict": "pays (the session gain's whole interval >= pays_at), does not pay (wholly "
    "below), undecided (the interval straddles it); unstable (OFF, ON or both queues grow) "
    "where an arm is unstable, whatever the interval",
    "stable_off": "pool off keeps up with the offered load at this level: its TTFT grows at "
    f"most {MAX_GROWTH:g} s per second of scheduled session starts, and an open loop serves "
    f"at least {MIN_SERVED_SHARE:g} of its offered turns (the replay's load table, every "
    "replicate pooled; a closed loop always is)",
    "stable_on": "the same, pool on",
    "ttft_growth_off": "pool off: TTFT growth with the sessions' scheduled starts, s per s "
    "(median TTFT of the last third of sessions to start minus the first's, over their "
    "starts' distance; null without scheduled starts)",
    "ttft_growth_on": "the same, pool on",
    "ttft_sum_gain": "the same ratio of the whole-session TTFT sum (prefill and queueing "
    "only, the part the pool shortens; no decode)",
    "later_turn_gain": "median per-turn gain (turns 2..): the median over turns 2.. of each "
    "turn's own gain (its median TTFT OFF / ON); not the later-turn gain (later_gain), "
    "which takes one median over every later turn's TTFT pooled; a turn whose own gain "
    "stands far from this median is named in the replay report (turn 2: 4.2x)",
    "ttft_p50_off_s": "median TTFT over every turn, pool off, modeled s",
    "ttft_p50_on_s": "median TTFT over every turn, pool on, modeled s",
    "ttft_p90_on_s": "90th percentile TTFT over every turn, pool on, modeled s",
    "good_turns_off": "share of turns with TTFT within the objective, pool off",
    "good_turns_on": "share of turns with TTFT within the objective, pool on",
    "good_turns_off_low": "lower end of that share's 95% interval, pool off (sessions the "
    "clusters: Clopper-Pearson on the effective sample size, Korn & Graubard 1998; all "
    "good turns read [x, 1])",
    "good_turns_off_high": "upper end of that share's 95% interval, pool off",
    "good_turns_on_low": "lower end of that share's 95% interval, pool on",
    "good_turns_on_high": "upper end of that share's 95% interval, pool on",
    "attainment": "the objective's attainment: the share of good turns an arm needs to meet "
    "it (null without an [objective])",
    "objective_off": "meets (goodput's whole interval >= attainment), misses (wholly below, "
    "or the arm is unstable), undecided (straddles it, or too few sessions), pool off",
    "objective_on": "the same, pool on",
    "local_hit_rate_on": "prompt tokens served from the replica's own cache, pool on",
    "pool_hit_rate_on": "prompt tokens served from the shared pool, pool on",
    "queue_p90_on_s": "90th percentile of the server's arrival -> admission wait, pool on, "
    "modeled s",
    "requests": "requests of the configuration and placement, both arms",
    "in_flight_p50_off": "requests in flight (sent, not yet ended), median over the modeled "
    "time of the arm's blocks, pool off, as the records measured it "
    "(sessiongen.analysis.load.in_flight_table): what an open loop actually held",
    "in_flight_p50_on": "the same, pool on",
    "in_flight_p90_off": "requests in flight, 90th percentile over time, pool off",
    "in_flight_p90_on": "the same, pool on",
    "before_first_token_p50_off": "requests sent and before their first token (queued or in "
    "prefill), median over time, pool off",
    "before_first_token_p50_on": "the same, pool on",
    "robustness": "the verdict over the profile's box: each parameter at its fitted "
    "interval's ends (else -/+10%), the others at the profile's; at an end, the cell's "
    "gain and interval times what the end does to replicate 0's gain (one planned run "
    "per end, the same seed; sensitivity.parquet has every end); robust when every end "
    "gives the cell's verdict, else which parameter flips it and which way ('pays "
    "unless prefill_s_per_ktok is 10% below the profile's'), 'near saturation' where an "
    "arm turns unstable at an end (sessiongen.capacity.sensitivity)",
    "sensitive_to": "the parameters that flip the verdict inside the box, comma-joined "
    "(null when none does)",
}


#: What the columns that name a what-if row mean (the varied keys aside).
ROW_COLUMNS = {
    "config": "the configuration's number; its run folder is configs/NN-...",
    "placement": "where each turn goes (a client placement, or router:POLICY)",
    "context_tokens": "the sessions' initial context, tokens",
}


#: What a trace's load level is: none; its requests arrive at the trace's timestamps.
TRACE_LEVEL = "open loop, trace timestamps"


def level_name(arrival: str, *, trace: bool = False) -> str:
    """What a load level is: a concurrency (closed loop), a start rate (open loop), or,
    for a trace, none (:data:`TRACE_LEVEL`)."""
    if trace:
        return TRACE_LEVEL
    return "concurrency" if arrival == "closed" else "sessions/s"


#: A trace's cells: no load level, no initial context (each request has its own length).
TRACE_NULL = ("load_level", "context_tokens")


def trace_cells(frame: pl.DataFrame, *, trace: bool) -> pl.DataFrame:
    """``frame`` with :data:`TRACE_NULL` null for a trace (their values there are unused
    defaults: a level of 4 "sessions in flight" a trace never had, a context of 0)."""
    if not trace:
        return frame
    return frame.with_columns(
        pl.lit(None, dtype=frame.schema[c]).alias(c) for c in TRACE_NULL if c in frame.columns
    )


def gain_name(*, one_turn: bool) -> str:
    """The gain's name: "request gain" where every session is one request (a trace
    without sessions), else "session gain"."""
    return "request gain" if one_turn else "session gain"


def describe_columns(
    columns: Sequence[str],
    varies: Sequence[Vary],
    arrival: str,
    *,
    trace: bool = False,
    one_turn: bool = False,
) -> list[tuple[str, str]]:
    """``(column, meaning)`` for each of ``columns``, in their order: the list a report
    prints beside its table, built from the table itself so the two cannot drift (a
    column nobody described is a :class:`KeyError`). A ``trace`` has no load level nor
    initial context (null, :func:`trace_cells`); where every session is ``one_turn``
    (a trace without sessions) the session gain is a per-request gain and says so."""
    varied = {v.key for v in varies}
    level = (
        "sessions in flight at once (closed loop)"
        if arrival == "closed"
        else "new sessions per modeled second (open loop)"
    )
    meanings = {**ROW_COLUMNS, "load_level": level, **WHATIF_COLUMNS}
    if trace:
        meanings["load_level"] = (
            f"null: {TRACE_LEVEL} (no level was set; in_flight_* say what the arms held)"
        )
        meanings["context_tokens"] = "null: a trace's requests each have their own length"
    if one_turn:
        meanings |= {
            k: v.replace("session gain", "request gain").replace("sessions", "requests")
            for k, v in WHATIF_COLUMNS.items()
            if k.startswith("session_gain") or k == "sessions"
        }
        meanings["session_gain"] = (
            "request gain: median end-to-end time of a request OFF / ON (every session of "
            "this trace is one request, so it includes the request's decode time)"
        )
    if trace:  # what the interval resampled: blocks of consecutive requests in time
        meanings["sessions"] = (
            "time blocks (runs of consecutive requests) the gain's interval resamples "
            "(replicates x blocks)"
        )
    return [
        (c, "varied: this configuration's value" if c in varied else meanings[c]) for c in columns
    ]


@dataclass(frozen=True)
class Vary:
    """One ``--vary KEY=V1,V2,...`` option: a dotted key and its values as written."""

    key: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Vary:
        """Values are split at commas outside brackets and quotes, so a list value is
        written as one: ``load.levels=[1,2],[4,8]``."""
        key, sep, rest = text.partition("=")
        key = key.strip()
        if not sep or not key or any(not p for p in key.split(".")):
            raise UserError(f"--vary {text!r}: expected KEY=V1,V2,...")
        values = tuple(v.strip() for v in _split_top(rest) if v.strip())
        if not values:
            raise UserError(f"--vary {text!r}: expected at least one value after '='")
        if len(set(values)) != len(values):
            raise UserError(f"--vary {text!r}: expected each value once")
        return cls(key, values)

    @property
    def name(self) -> str:
        """The key's last part, for labels and columns (``pool_capacity_tokens``)."""
        return self.key.rsplit(".", 1)[-1]


def _split_top(text: str) -> list[str]:
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


@dataclass(frozen=True)
class Config:
    """One point of the grid: its index, the varied values, the scenario they give."""

    index: int
    values: dict[str, str]  # varied key -> value as written
    scenario: Scenario

    @property
    def label(self) -> str:
        parts = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.values.items()]
        return " ".join(parts) or "as given"

    @property
    def folder(self) -> str:
        slug = re.sub(r"[^A-Za-z0-9=._-]+", "_", self.label.replace(" ", "_"))[:80]
        return f"{self.index:02d}-{slug}"
