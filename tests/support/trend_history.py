"""Synthetic nightly histories written straight into a trend store (no replay needed).

Each night is a frame shaped like :func:`sessiongen.analysis.latency.run_summary` with known
levels: median TTFT per (placement, cache, context, turn) times lognormal night noise,
its 95% interval (plain, or expanded for the session count as real summaries are) and
standard error consistent with that noise, and the speedup OFF/ON likewise. A
:class:`Night` plants effects: a slowdown of some cells, a speedup change, counts.
``legacy`` nights are written as stores were before ``cache_failures`` existed (no
correctness columns but ``divergences`` and the needle grades).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats as sps

from sessiongen.analysis.stats import expanded_conf
from sessiongen.trend import store as tstore

Z95 = 1.959963984540054
START = datetime(2026, 11, 1, 2, 0, 0, tzinfo=UTC)
#: Cell -> multiplier; a cell is (placement, cache, turn) and "*" matches any value.
Factors = Mapping[tuple[str, str, int | str], float]


@dataclass(frozen=True)
class Night:
    """One night's planted truth."""

    ttft: Factors = field(default_factory=dict)  # TTFT multipliers (cache "on" only affects ON)
    speedup: Factors = field(default_factory=dict)  # speedup multipliers (cache is "on")
    noise: float = 0.05  # night-to-night SD of a value, log scale
    #: SD the night's own interval implies (within-run noise, log scale); None: ``noise``,
    #: an interval that knows all the night-to-night noise. Smaller: the bootstrap sees
    #: only part of it, and the rest (``sqrt(noise**2 - ci_noise**2)``) is night noise.
    ci_noise: float | None = None
    ci_jitter: float = 0.0  # lognormal SD of each interval's width around ``ci_noise``
    zero_width: float = 0.0  # probability that an interval has zero width (one sample)
    louder: Factors = field(default_factory=dict)  # noise multipliers of some cells
    contamination: int = 0
    divergences: int = 0  # on turn 2: ON rows (legacy: both arms' rows)
    errors: int = 0
    needle_wrong: int = 0  # wrong needle answers on the last turn, ON rows
    needle_off_wrong: int = 0  # the same, OFF rows
    cache_failures: int = 0  # on turn 2, ON rows
    off_inconsistent: int = 0  # on turn 2, OFF rows
    legacy: bool = False  # written without the correctness columns of today
    missing: Sequence[tuple[str, str, int]] = ()  # cells absent this night
    versions: Mapping[str, str] = field(default_factory=dict)  # on top of the defaults
    sessions: int = 16  # sessions behind each interval
    #: "plain": a 95% normal interval; "expanded": 95% expanded for ``sessions``, as
    #: run_summary writes them (Hesterberg), far wider at 4 to 8 sessions.
    interval: str = "plain"
    store_se: bool = True  # write the standard errors (stores before them had none)


def _factor(factors: Factors, placement: str, cache: str, turn: int) -> float:
    out = 1.0
    for (p, c, t), value in factors.items():
        if p in ("*", placement) and c in ("*", cache) and t in ("*", turn):
            out *= value
    return out


def base_ttft(placement: str, cache: str, ctx: int, turn: int) -> float:
    """The planted noiseless TTFT: cold turns ~ context, ON cross-replica turns 4x faster."""
    cold = 0.136 * ctx / 1000
    if turn == 1 or cache == "off":
        return cold if placement == "alternate" or turn == 1 else 0.3
    return cold / 4 if placement == "alternate" else 0.3


def _draw(night: Night, rng: np.random.Generator, loud: float = 1.0) -> tuple[float, float, float]:
    """A night's multiplicative noise, its interval's half-width factor and its log SE."""
    noise = night.noise * loud
    z = Z95
    if night.interval == "expanded":
        z = float(sps.norm.ppf(0.5 + expanded_conf(0.95, night.sessions) / 2))
    if night.ci_noise is None:
        return math.exp(rng.normal(0.0, noise)), math.exp(z * noise), noise
    within = night.ci_noise * loud * math.exp(rng.normal(0.0, night.ci_jitter))
    between = math.sqrt(max(0.0, noise**2 - (night.ci_noise * loud) ** 2))
    noisy = math.exp(rng.normal(0.0, within) + rng.normal(0.0, between))
    if rng.random() < night.zero_width:
        return noisy, 1.0, 0.0
    return noisy, math.exp(z * within), within


def summary_frame(
    night: Night,
    rng: np.random.Generator,
    placements: Sequence[str] = ("alternate", "fixed"),
    contexts: Sequence[int] = (32768,),
    turns: int = 3,
) -> pl.DataFrame:
    """One night's run_summary-shaped frame."""
    rows = []
    for placement in placements:
        for ctx in contexts:
            for turn in range(1, turns + 1):
                truth = {c: base_ttft(placement, c, ctx, turn) for c in ("off", "on")}
                for cache in ("off", "on"):
                    if (placement, cache, turn) in night.missing:
                        continue
                    noisy, half, se = _draw(
                        night, rng, _factor(night.louder, placement, cache, turn)
                    )
                    ttft = truth[cache] * _factor(night.ttft, placement, cache, turn) * noisy
                    row = {
                        "placement": placement,
                        "cache": cache,
                        "context_tokens": ctx,
                        "turn": turn,
                        "n": 16,
                        "sessions": night.sessions,
                        "errors": night.errors if (cache, turn) == ("on", 2) else 0,
                        "median_ttft_s": ttft,
                        "ci_low_s": ttft / half,
                        "ci_high_s": ttft * half,
                        "ttft_log_se": se,
                        "p90_ttft_s": ttft * 1.2,
                        "speedup": None,
                        "speedup_ci_low": None,
                        "speedup_ci_high": None,
                        "speedup_log_se": None,
                        "speedup_sessions": None,
                        "contamination": night.contamination if cache == "off" and turn == 1 else 0,
                        "divergences": _on_turn(night.divergences, 2, turn, cache, night),
                        "pool_divergences": 0,
                        "needle_graded": 16,
                        "needle_correct": 16 - _needles_wrong(night, cache, turn, turns),
                        "cache_failures": night.cache_failures if (cache, turn) == ("on", 2) else 0,
                        "off_inconsistent": night.off_inconsistent
                        if (cache, turn) == ("off", 2)
                        else 0,
                        "on_only": 0,
                    }
                    if cache == "on":
                        s = (
                            truth["off"]
                            / truth["on"]
                            * _factor(night.speedup, placement, "on", turn)
                        )
                        loud = _factor(night.louder, placement, "speedup", turn)
                        noisy, half, se = _draw(night, rng, loud)
                        s *= noisy
                        row.update(speedup=s, speedup_ci_low=s / half, speedup_ci_high=s * half)
                        row.update(speedup_log_se=se, speedup_sessions=night.sessions)
                    rows.append(row)
    frame = pl.DataFrame(rows, schema=SUMMARY_SCHEMA)
    if night.legacy:
        frame = frame.drop(*NEW_COLUMNS)
    if night.legacy or not night.store_se:
        frame = frame.drop(*SE_COLUMNS)
    return frame


def _on_turn(count: int, at: int, turn: int, cache: str, night: Night) -> int:
    """``count`` on turn ``at``: on ON rows, or on both arms' rows for legacy nights."""
    return count if turn == at and (cache == "on" or night.legacy) else 0


def _needles_wrong(night: Night, cache: str, turn: int, turns: int) -> int:
    if turn != turns:
        return 0
    return night.needle_wrong if cache == "on" else night.needle_off_wrong


#: Summary columns that stores written before ``cache_failures`` lack.
NEW_COLUMNS = ("cache_failures", "pool_divergences", "off_inconsistent", "on_only")
#: Summary columns that stores written before the standard errors were kept lack.
SE_COLUMNS = ("sessions", "ttft_log_se", "speedup_log_se", "speedup_sessions")


SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "placement": pl.String(),
    "cache": pl.String(),
    "context_tokens": pl.Int64(),
    "turn": pl.Int32(),
    "n": pl.UInt32(),
    "sessions": pl.Int64(),
    "errors": pl.UInt32(),
    "median_ttft_s": pl.Float64(),
    "ci_low_s": pl.Float64(),
    "ci_high_s": pl.Float64(),
    "ttft_log_se": pl.Float64(),
    "p90_ttft_s": pl.Float64(),
    "speedup": pl.Float64(),
    "speedup_ci_low": pl.Float64(),
    "speedup_ci_high": pl.Float64(),
    "speedup_log_se": pl.Float64(),
    "speedup_sessions": pl.Int64(),
    "contamination": pl.UInt32(),
    "divergences": pl.UInt32(),
    "pool_divergences": pl.UInt32(),
    "needle_graded": pl.UInt32(),
    "needle_correct": pl.UInt32(),
    "cache_failures": pl.UInt32(),
    "off_inconsistent": pl.UInt32(),
    "on_only": pl.UInt32(),
}


def identity(
    i: int, name: str = "nightly", versions: Mapping[str, str] | None = None
) -> tstore.RunIdentity:
    """The identity of night ``i`` (one day apart, 02:00 UTC)."""
    when = START + timedelta(days=i)
    base = {"sessiongen": "0.1.0", "git_sha": "abc123", "target": "sim", "sim.slowdown": "1.0"}
    scale = float((versions or {}).get("sim.time_scale", 1.0))
    return tstore.RunIdentity(
        run_id=f"{when:%Y%m%dT%H%M%SZ}-{name}-{i:04x}",
        scenario_name=name,
        scenario_digest=f"{name}-digest",
        started_at=when.isoformat(timespec="seconds"),
        target_kind="sim",
        simulated=True,
        versions={**base, **(versions or {})},
        time_scale=scale,
    )


def night_label(i: int) -> str:
    return f"{START + timedelta(days=i):%Y-%m-%d}"


def write_history(
    store: Path, nights: Sequence[Night], seed: int = 0, name: str = "nightly", first: int = 0
) -> list[Path]:
    """Write nights ``first..`` of a history into ``store``; return the files written."""
    rng = np.random.default_rng([seed, first])
    paths = []
    for i, night in enumerate(nights, start=first):
        path = tstore.add_summary(
            store, summary_frame(night, rng), identity(i, name, night.versions)
        )
        assert path is not None
        paths.append(path)
    return paths


def history_frame(
    nights: Sequence[Night],
    seed: int,
    placements: Sequence[str] = ("alternate",),
    turns: int = 2,
    contexts: Sequence[int] = (32768,),
) -> pl.DataFrame:
    """A history as one in-memory store frame, without files (for fast many-seed checks)."""
    rng = np.random.default_rng(seed)
    frames = []
    for i, night in enumerate(nights):
        ident = identity(i, versions=night.versions)
        frames.append(
            summary_frame(night, rng, placements, contexts, turns).with_columns(
                run_id=pl.lit(ident.run_id),
                started_at=pl.lit(ident.started_at),
                night=pl.lit(ident.started_at[:10]),
                target_kind=pl.lit("sim"),
                versions=pl.lit(json.dumps(ident.versions, sort_keys=True)),
                folder=pl.lit(ident.folder),
            )
        )
    return pl.concat(frames)
