"""The grid of a what-if plan: ``--vary`` options, the configurations they give, and
what the what-if table's columns mean.

Kept apart from :mod:`.plan` (which runs the grid) so that the report stage
(:mod:`sessiongen.report.whatif`) can name configurations and columns without
importing the planner that calls it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sessiongen.analysis.latency import SESSION_GAIN
from sessiongen.analysis.load import MAX_GROWTH, MIN_SERVED_SHARE
from sessiongen.errors import UserError
from sessiongen.scenario.spec import Scenario
from sessiongen.scenario.spec import load as load_scenario

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
    "later_turn_gain": "median over turns 2.. of each turn's median TTFT, OFF / ON",
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
}


#: What the columns that name a what-if row mean (the varied keys aside).
ROW_COLUMNS = {
    "config": "the configuration's number; its run folder is configs/NN-...",
    "placement": "where each turn goes (a client placement, or router:POLICY)",
    "context_tokens": "the sessions' initial context, tokens",
}


def level_name(arrival: str) -> str:
    """What a load level is: a concurrency (closed loop) or a start rate (open loop)."""
    return "concurrency" if arrival == "closed" else "sessions/s"


def describe_columns(
    columns: Sequence[str], varies: Sequence[Vary], arrival: str
) -> list[tuple[str, str]]:
    """``(column, meaning)`` for each of ``columns``, in their order: the list a report
    prints beside its table, built from the table itself so the two cannot drift (a
    column nobody described is a :class:`KeyError`)."""
    varied = {v.key for v in varies}
    level = (
        "sessions in flight at once (closed loop)"
        if arrival == "closed"
        else "new sessions per modeled second (open loop)"
    )
    meanings = {**ROW_COLUMNS, "load_level": level, **WHATIF_COLUMNS}
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


def configs(path: str | Path, overrides: Sequence[str], varies: Sequence[Vary]) -> list[Config]:
    """Every configuration of the grid, validated before anything runs (a bad value is a
    one-line error naming the key)."""
    keys = [v.key for v in varies]
    if len(set(keys)) != len(keys):
        raise UserError("--vary: each key once (give all its values in one option)")
    out = []
    for i, combo in enumerate(itertools.product(*(v.values for v in varies))):
        values = dict(zip(keys, combo, strict=True))
        sets = [*overrides, *(f"{k}={v}" for k, v in values.items())]
        out.append(Config(i, values, load_scenario(path, sets)))
    return out
