"""Routers in the loop: how often each placement moved a session, and whether the pool
still pays when a router picks the replica.

Definitions
-----------
- **Routed** placements are ``router:POLICY`` and ``gateway`` (a router picked the
  replica); the others are client placements (the client picked it).
- **Known share**: of a placement's measured requests, the share whose serving replica
  is known (``replica`` not null; ``replica_source`` says how it was found, see
  :data:`sessiongen.records.format.REPLICA_SOURCES`). Client placements: always 1.
- **Moved share**: of the turns after the first whose ``cross_replica`` is known, the
  share that ran on another replica than the session's previous turn. Measured from
  the served replicas, never assumed from the policy. Turns whose previous or own
  replica is unknown are left out (``transitions`` counts those kept).
- **Per-turn gain**: the pool's speedup on turns 2 and later, pooled: median TTFT with
  the cache off / with it on over all those turns, with the session-paired bootstrap
  interval of :func:`~sessiongen.analysis.latency.speedup_table`: the typical later
  turn. ``turn_gain_min`` and ``turn_gain_max`` give the range of the single turns'
  speedups, ``best_turn`` the turn of the largest (where the pool mattered most).
- **Session gain**: :data:`~sessiongen.analysis.latency.SESSION_GAIN`, computed by
  :func:`~sessiongen.analysis.latency.session_speedup`.
- **The pool's gain survives** the placement when the session gain's interval lies
  above ``1 + MIN_GAIN`` (``survives`` true); false otherwise; null when there is no
  interval (an arm missing). See :data:`MIN_GAIN` for why not simply above 1.
- **Added time**: the median of client TTFT minus the replica's own TTFT
  (``server_ttft_s``, simulated targets only): what the client, loopback and any router
  in between added, in modeled seconds (a router's wall milliseconds count 1 / time
  scale times).
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from sessiongen.analysis.latency import session_speedup, speedup_table
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.records.run import Run
from sessiongen.scenario.routerspec import is_routed

_KEYS = ["placement", "context_tokens"]

#: A whole-session gain counts only when its interval clears 1 by this much. Measured: in
#: two runs of scenarios/router128k.toml on the simulated pair (time scale 0.05), the
#: placements that moved no turn, where the pool has nothing to serve, showed session
#: gains from 0.96x to 1.05x with intervals excluding 1 (a router's own wall time varies
#: between blocks on a busy host and counts 20 times in modeled seconds). 5% is also the
#: smallest change ``sessiongen compare`` counts by default.
MIN_GAIN = 0.05


def routed_placements(run: Run) -> list[str]:
    """The run's routed placements (``router:POLICY``, ``gateway``), sorted."""
    return sorted(p for p in run.requests["placement"].unique().to_list() if is_routed(p))


def has_routed(run: Run) -> bool:
    """Whether any placement of the run was routed."""
    return bool(routed_placements(run))


def replica_moves(run: Run) -> pl.DataFrame:
    """Per placement, cache arm and context size: requests, known share, moved share, and
    how the serving replicas were found (``sources``, e.g. ``header+counters: 36``)."""
    keys = ["placement", "cache", "context_tokens"]
    req = run.requests.with_columns(
        pl.col("replica_source").fill_null("placement"),
        later=(pl.col("turn") > 1) & pl.col("cross_replica").is_not_null(),
    )
    counts = req.group_by(keys).agg(
        requests=pl.len(),
        known=pl.col("replica").is_not_null().sum(),
        transitions=pl.col("later").sum(),
        moved=(pl.col("later") & pl.col("cross_replica").fill_null(False)).sum(),
    )
    sources = (
        req.group_by([*keys, "replica_source"])
        .len()
        .sort([*keys, "len"], descending=[False, False, False, True])
        .group_by(keys, maintain_order=True)
        .agg(
            sources=pl.concat_str(
                pl.col("replica_source"), pl.lit(": "), pl.col("len").cast(pl.String)
            ).str.join(", ")
        )
    )
    return (
        counts.join(sources, on=keys, how="left", nulls_equal=True)
        .with_columns(
            routed=pl.col("placement").is_in(routed_placements(run)),
            known_share=pl.col("known") / pl.col("requests"),
            moved_share=pl.when(pl.col("transitions") > 0).then(
                pl.col("moved") / pl.col("transitions")
            ),
        )
        .select(
            *keys,
            "routed",
            "requests",
            "known",
            "known_share",
            "transitions",
            "moved",
            "moved_share",
            "sources",
        )
        .sort(keys)
    )


def later_turn_gain(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pl.DataFrame:
    """Per placement and context size: the pool's speedup over turns 2+ pooled, with its
    interval, and the range of the single later turns' speedups."""
    later = run.filter(pl.col("turn") > 1)
    pooled = replace(later, requests=later.requests.with_columns(pl.lit(0, pl.Int32).alias("turn")))
    table = speedup_table(pooled, boot=boot).select(
        *_KEYS,
        turn_gain="speedup",
        turn_gain_ci_low="speedup_ci_low",
        turn_gain_ci_high="speedup_ci_high",
    )
    ranges = (
        speedup_table(later, boot=boot)
        .drop_nulls("speedup")
        .group_by(_KEYS)
        .agg(
            turn_gain_min=pl.col("speedup").min(),
            turn_gain_max=pl.col("speedup").max(),
            best_turn=pl.col("turn").sort_by("speedup").last(),
        )
    )
    return table.join(ranges, on=_KEYS, how="left", nulls_equal=True)


def added_time(run: Run) -> pl.DataFrame:
    """Per placement and context size: median client TTFT minus the replica's own
    (modeled seconds; simulated targets only, else no rows)."""
    rows = run.ok.filter(pl.col("server_ttft_s").is_not_null())
    return rows.group_by(_KEYS).agg(added_s=(pl.col("ttft_s") - pl.col("server_ttft_s")).median())


def routing_headline(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pl.DataFrame:
    """Per placement (client or router policy) and context size: the share of turns that
    changed replica, the share of requests whose replica is known, the pool's per-turn
    and whole-session gain with intervals, whether that gain survives, and the added
    time (see the module docstring)."""
    moves = (
        replica_moves(run)
        .group_by(_KEYS)
        .agg(
            pl.col("routed").first(),
            pl.col("requests").sum(),
            pl.col("known").sum(),
            pl.col("transitions").sum(),
            pl.col("moved").sum(),
        )
        .with_columns(
            known_share=pl.col("known") / pl.col("requests"),
            moved_share=pl.when(pl.col("transitions") > 0).then(
                pl.col("moved") / pl.col("transitions")
            ),
        )
    )
    sessions = session_speedup(run, boot=boot).select(
        *_KEYS,
        session_gain="speedup",
        session_gain_ci_low="speedup_ci_low",
        session_gain_ci_high="speedup_ci_high",
    )
    out = (
        moves.join(later_turn_gain(run, boot=boot), on=_KEYS, how="left", nulls_equal=True)
        .join(sessions, on=_KEYS, how="left", nulls_equal=True)
        .join(added_time(run), on=_KEYS, how="left", nulls_equal=True)
        .with_columns(
            kind=pl.when(pl.col("routed")).then(pl.lit("router")).otherwise(pl.lit("client")),
            survives=pl.when(pl.col("session_gain_ci_low").is_not_null()).then(
                pl.col("session_gain_ci_low") > 1.0 + MIN_GAIN
            ),
        )
    )
    return out.select(
        "placement",
        "context_tokens",
        "kind",
        "requests",
        "known_share",
        "transitions",
        "moved_share",
        "turn_gain",
        "turn_gain_ci_low",
        "turn_gain_ci_high",
        "turn_gain_min",
        "turn_gain_max",
        "best_turn",
        "session_gain",
        "session_gain_ci_low",
        "session_gain_ci_high",
        "survives",
        "added_s",
    ).sort("kind", "placement", "context_tokens")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _gain(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "-"
    if low is None or high is None:
        return f"{value:.2f}x"
    return f"{value:.2f}x [{low:.2f}, {high:.2f}]"


def console_routing(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> str | None:
    """The routing headline as plain text, or None when no placement was routed."""
    if not has_routed(run):
        return None
    table = routing_headline(run, boot=boot)
    multi = table["context_tokens"].n_unique() > 1
    header = [
        "placement",
        "moved",
        "known",
        "turns 2+ gain (median)",
        "best turn",
        "session gain",
        "pool pays",
    ]
    rows = [header]
    for r in table.iter_rows(named=True):
        name = r["placement"] + (f" @{r['context_tokens']}" if multi else "")
        survives = {True: "yes", False: "no", None: "-"}[r["survives"]]
        rows.append(
            [
                name,
                _pct(r["moved_share"]),
                _pct(r["known_share"]),
                _gain(r["turn_gain"], r["turn_gain_ci_low"], r["turn_gain_ci_high"]),
                "-"
                if r["best_turn"] is None
                else f"{r['turn_gain_max']:.2f}x (turn {r['best_turn']})",
                _gain(r["session_gain"], r["session_gain_ci_low"], r["session_gain_ci_high"]),
                survives,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["Placements and routers: turns that changed replica, and the pool's gain"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
