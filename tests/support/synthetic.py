"""Write realistic run folders with planted effects, for analysis and report tests.

:func:`write_run` produces what ``sessiongen replay`` writes (``manifest.json``,
``requests.parquet``, ``metrics.parquet``) from a :class:`SyntheticSpec`. The truth is
known: TTFT in the ON arm is the OFF TTFT divided by ``speedup[placement]`` on turns >= 2
(turn 1 is cold in both arms), times a per-session factor shared by all arms and a
per-request lognormal noise. Durations are written in wall seconds (modeled seconds times
``time_scale``), as the driver does for simulated targets.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl

from sessiongen import scenario
from sessiongen.analysis.frames import rows_frame
from sessiongen.records import format as fmt
from sessiongen.records import io as records

QUESTION_TOKENS = 55
ANSWER_TOKENS = 200
ITL_S = 0.015


def _default_speedup() -> dict[str, float]:
    return {"alternate": 4.0, "fixed": 1.0}


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate and which effects to plant."""

    name: str = "synthetic"
    placements: tuple[str, ...] = ("alternate", "fixed")
    sessions: int = 8
    turns: int = 6
    contexts: tuple[int, ...] = (32768,)
    blocks: tuple[str, ...] = ("off", "on", "on", "off")
    speedup: dict[str, float] = field(default_factory=_default_speedup)
    session_sigma: float = 0.3  # per-session factor shared by all arms (pairing helps)
    noise_sigma: float = 0.06  # per-request noise
    time_scale: float = 0.1
    simulated: bool = True
    slowdown: float = 1.0  # multiplies every latency (a "run B" for compare)
    seed: int = 0  # the scenario seed: sessions (and their per-session factors)
    noise_seed: int = 0  # per-request noise: a repeat run of the same scenario differs here
    run_sigma: float = 0.0  # per-cell run effect (host, clock, restart luck), from noise_seed
    drift: float = 1.0  # multiplies TTFT in the last OFF block of drift_placement
    drift_placement: str = "fixed"
    contaminate: bool = False  # 2 cold-turn hits (alternate/on) + 1 external hit (off)
    failing_sessions: int = 0  # sessions failing at turn 3 in alternate's first ON block
    probe: str = "none"  # none | needle | equivalence
    needle_wrong: int = 0  # last sessions answer wrong at turn 6 in alternate's first ON block
    diverge: int = 0  # last sessions' turn-4 output differs in alternate's first ON block
    off_diverge: int = 0  # first sessions' turn-4 output differs in alternate's last OFF block
    needle_off_wrong: int = 0  # first sessions answer wrong at turn 5 in alternate's OFF blocks
    block_salts: bool = False  # every block its own salt (targets that cannot restart)
    schema_version: int = fmt.SCHEMA_VERSION  # 1: no prompt_digest (records before schema 2)
    shared_prefix_tokens: int = 0
    warmup: int = 2  # warm-up rows per block, with an absurd TTFT so a leak shows
    started: datetime = datetime(2026, 11, 30, 14, 0, 0, tzinfo=UTC)


def prompt_tokens(ctx: int, turn: int) -> int:
    """Prompt size of a turn: context, earlier questions and answers, this question."""
    return ctx + (turn - 1) * (QUESTION_TOKENS + ANSWER_TOKENS) + QUESTION_TOKENS


def cold_ttft(tokens: int) -> float:
    """Modeled cold prefill time (the simulator's quadratic fit), seconds."""
    k = tokens / 1000
    return 0.136 * k + 8.7e-4 * k * k


def true_ttft(spec: SyntheticSpec, placement: str, cache: str, ctx: int, turn: int) -> float:
    """The planted median modeled TTFT of an arm and turn (before session factors)."""
    if turn == 1:
        return cold_ttft(prompt_tokens(ctx, 1)) * spec.slowdown
    if placement == "fixed":
        off = 0.2 + cold_ttft(QUESTION_TOKENS + ANSWER_TOKENS)
    else:
        off = cold_ttft(prompt_tokens(ctx, turn))
    factor = spec.speedup.get(placement, 1.0) if cache == "on" else 1.0
    return off / factor * spec.slowdown


def _hits(spec: SyntheticSpec, placement: str, cache: str, ctx: int, turn: int) -> tuple[int, int]:
    """(local, external) prefix-hit tokens a sane cache would report.

    Under ``alternate`` the replica's own cache is taken to have evicted the session by
    the time it returns, so only the shared pool (cache on) helps: that is what makes the
    planted speedup plausible.
    """
    if turn == 1:
        return spec.shared_prefix_tokens, 0
    previous = prompt_tokens(ctx, turn - 1) + ANSWER_TOKENS
    if placement == "fixed":
        return previous // 16 * 16, 0
    local = spec.shared_prefix_tokens
    external = (previous - local) // 1568 * 1568 if cache == "on" else 0
    return local, external


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:16]


def _request_row(
    spec: SyntheticSpec, rng: np.random.Generator, base: dict[str, Any], session_factor: float
) -> dict[str, Any]:
    placement, cache, ctx, turn = (
        base["placement"],
        base["cache"],
        base["context_tokens"],
        base["turn"],
    )
    ttft = true_ttft(spec, placement, cache, ctx, turn) * session_factor * base.pop("_run")
    ttft *= float(rng.lognormal(0.0, spec.noise_sigma))
    if cache == "off" and placement == spec.drift_placement and base["last_off"]:
        ttft *= spec.drift
    e2e = ttft + ANSWER_TOKENS * ITL_S
    local, external = _hits(spec, placement, cache, ctx, turn)
    scale = spec.time_scale
    row = dict(base)
    row.update(
        prompt_tokens=prompt_tokens(ctx, turn),
        content_tokens=prompt_tokens(ctx, turn) - 12,
        cached_tokens=local + external,
        completion_tokens=ANSWER_TOKENS,
        output_chunks=ANSWER_TOKENS,
        queue_s=0.0,
        ttfb_s=ttft * 0.97 * scale,
        ttft_s=ttft * scale,
        e2e_s=e2e * scale,
        itl_p50_s=ITL_S * scale,
        itl_max_s=3 * ITL_S * scale,
        status="ok",
        http_status=200,
        local_hit_tokens=local,
        external_hit_tokens=external,
        output_digest=_digest(base["salt"], base["session_id"], turn),
        prompt_digest=_digest("prompt", base["salt"], base["session_id"], turn),
        output_text="The answer is ...",
        first_logprob=-0.125,
        loop_lag_flag=False,
    )
    if spec.probe == "needle":
        row.update(expected=f"code-{base['session_index']}-{turn}", answer_correct=True)
    return row


def _plant(spec: SyntheticSpec, row: dict[str, Any]) -> dict[str, Any] | None:
    """Apply planted faults to one row; None drops it (a session stopped by a failure)."""
    alt_on_first = row["placement"] == "alternate" and row["block_in_placement"] == 1
    s, turn = row["session_index"], row["turn"]
    if alt_on_first and s < spec.failing_sessions and turn >= 3:
        if turn > 3:
            return None
        row.update(status="timeout", http_status=None, error="stalled past request timeout")
        row.update({k: None for k in ("ttft_s", "ttfb_s", "cached_tokens", "output_digest")})
        row.update(e2e_s=900.0, local_hit_tokens=None, external_hit_tokens=None)
    if alt_on_first and turn == 6 and s >= spec.sessions - spec.needle_wrong:
        row["answer_correct"] = False
    if alt_on_first and turn == 4 and s >= spec.sessions - spec.diverge:
        row.update(output_digest="ffffffffffffffff", first_logprob=-2.5)
    alt_off = row["placement"] == "alternate" and row["cache"] == "off"
    alt_off_last = alt_off and row["block_in_placement"] == len(spec.blocks) - 1
    if alt_off_last and turn == 4 and s < spec.off_diverge:
        row.update(output_digest="0ff0ff0ff0ff0ff0", first_logprob=-3.5)
    if alt_off and turn == 5 and s < spec.needle_off_wrong:
        row["answer_correct"] = False
    if spec.contaminate and row["placement"] == "alternate":
        if alt_on_first and turn == 1 and s < 2:
            row.update(cached_tokens=4096, local_hit_tokens=4096)
        if row["cache"] == "off" and row["block_in_placement"] == 0 and turn == 2 and s == 0:
            row["external_hit_tokens"] = 1568
    return row


def _replica(placement: str, session: int, turn: int) -> tuple[int, bool]:
    if placement == "alternate":
        return (turn - 1 + session) % 2, turn > 1
    return session % 2, False


def _rows(spec: SyntheticSpec, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    session_rng = np.random.default_rng(spec.seed)
    rng = np.random.default_rng([spec.seed, spec.noise_seed])
    factors = {
        (ctx, s): float(session_rng.lognormal(0.0, spec.session_sigma))
        for ctx in spec.contexts
        for s in range(spec.sessions)
    }
    run_rng = np.random.default_rng([spec.seed, spec.noise_seed, 99])
    run_effect = {
        (p, c, ctx, t): float(run_rng.lognormal(0.0, spec.run_sigma))
        for p in spec.placements
        for c in ("off", "on")
        for ctx in spec.contexts
        for t in range(1, spec.turns + 1)
    }
    rows: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    last_off = (
        max(i for i, c in enumerate(spec.blocks) if c == "off") if "off" in spec.blocks else -1
    )
    clock = 0.0
    for p_i, placement in enumerate(spec.placements):
        for bip, cache in enumerate(spec.blocks):
            block = p_i * len(spec.blocks) + bip
            salt = f"salt-{spec.seed}" + (f"-b{block}" if spec.block_salts else "")
            start = spec.started + timedelta(seconds=clock)
            common = dict(run_id=run_id, block=block, block_in_placement=bip, placement=placement)
            for w in range(spec.warmup):
                rows.append(
                    dict(
                        common,
                        cache=cache,
                        session_id=f"warmup-{block}-{w}",
                        turn=1,
                        warmup=True,
                        ttft_s=100.0,
                        e2e_s=101.0,
                        status="ok",
                        replica=w % 2,
                        send_s=clock,
                    )
                )
            for ctx in spec.contexts:
                for s in range(spec.sessions):
                    for turn in range(1, spec.turns + 1):
                        replica, cross = _replica(placement, s, turn)
                        base = dict(
                            common,
                            cache=cache,
                            session_id=f"{ctx // 1024}k-{s:03d}",
                            session_index=s,
                            context_tokens=ctx,
                            turn=turn,
                            replica=replica,
                            cross_replica=cross,
                            warmup=False,
                            send_s=clock,
                            last_off=(bip == last_off),
                            salt=salt,
                            _run=run_effect[(placement, cache, ctx, turn)],
                        )
                        row = _plant(spec, _request_row(spec, rng, base, factors[(ctx, s)]))
                        if row is not None:
                            rows.append(row)
                            clock += (row["e2e_s"] or 0.0) / 4
            end = spec.started + timedelta(seconds=clock)
            blocks.append(
                dict(
                    block=block,
                    placement=placement,
                    cache=cache,
                    block_in_placement=bip,
                    salt=salt,
                    status="ok",
                    started_at=start.isoformat(),
                    ended_at=end.isoformat(),
                )
            )
    return rows, blocks


def _metrics(run_id: str, blocks: list[dict[str, Any]]) -> pl.DataFrame:
    out: list[dict[str, Any]] = []
    for b in blocks:
        for replica in (0, 1):
            for moment, value in (("before", 0.0), ("after", 1000.0 * (b["block"] + 1))):
                for metric in ("vllm:prefix_cache_hits_total", "lmcache:retrieve_hit_tokens"):
                    out.append(
                        dict(
                            run_id=run_id,
                            block=b["block"],
                            placement=b["placement"],
                            cache=b["cache"],
                            replica=replica,
                            moment=moment,
                            metric=metric,
                            value=value,
                        )
                    )
    return rows_frame(out, fmt.METRICS_SCHEMA)


def make_scenario(spec: SyntheticSpec) -> scenario.Scenario:
    """The scenario a replay of this synthetic run would have used."""
    return scenario.from_dict(
        {
            "name": spec.name,
            "seed": spec.seed,
            "sessions": {
                "count": spec.sessions,
                "turns": spec.turns,
                "initial_context_tokens": list(spec.contexts),
                "question_tokens": QUESTION_TOKENS,
                "answer_tokens": ANSWER_TOKENS,
                "probe": spec.probe,
                "shared_prefix_tokens": spec.shared_prefix_tokens,
            },
            "placement": {"policies": list(spec.placements)},
            "design": {"blocks": list(spec.blocks)},
            "target": {"sim": {"time_scale": spec.time_scale, "slowdown": spec.slowdown}},
        }
    )


def write_run(root: Path, spec: SyntheticSpec | None = None, run_id: str | None = None) -> Path:
    """Write a run folder under ``root`` and return its path."""
    spec = spec or SyntheticSpec()
    scen = make_scenario(spec)
    suffix = f"{spec.seed:02x}{spec.noise_seed:02x}"
    run_id = run_id or f"{spec.started:%Y%m%dT%H%M%SZ}-{spec.name}-{suffix}"
    run_dir = Path(root) / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    rows, blocks = _rows(spec, run_id)
    requests = rows_frame(rows, fmt.REQUEST_SCHEMA)
    if spec.schema_version < 2:
        requests = requests.drop("prompt_digest", "server_ttft_s")
    records.atomic_write_parquet(run_dir / "requests.parquet", requests)
    records.atomic_write_parquet(run_dir / "metrics.parquet", _metrics(run_id, blocks))
    kind = "sim" if spec.simulated else "endpoints"
    manifest = {
        "schema_version": spec.schema_version,
        "run_id": run_id,
        "scenario_name": spec.name,
        "scenario": scen.to_dict(),
        "scenario_digest": scen.digest(),
        "seed": spec.seed,
        "salt": f"salt-{spec.seed}",
        "tokenizer": {"name": "cl100k", "digest": "0" * 16},
        "text_generator": {"name": "corpus-v1", "digest": "1" * 16},
        "tool": records.tool_identity(),
        "target": {
            "kind": kind,
            "simulated": spec.simulated,
            "time_scale": spec.time_scale,
            "sim": {"slowdown": spec.slowdown},
        },
        "host": records.host_facts(),
        "blocks": blocks,
        "started_at": blocks[0]["started_at"],
        "ended_at": blocks[-1]["ended_at"],
        "complete": True,
        "calibration": {"driver_added_ttft_p50_s": 0.0004, "driver_added_ttft_p99_s": 0.0021},
        "loop_lag": {"max_s": 0.003, "flagged_requests": 0},
    }
    records.write_manifest(run_dir, cast(fmt.Manifest, manifest))  # the fields tests read
    return run_dir


def with_changes(spec: SyntheticSpec, **changes: Any) -> SyntheticSpec:
    """A copy of ``spec`` with some fields changed (shorthand for tests)."""
    return replace(spec, **changes)


def expected_speedup(spec: SyntheticSpec, placement: str, turn: int) -> float:
    """The planted ON/OFF speedup of median TTFT."""
    return 1.0 if turn == 1 else spec.speedup.get(placement, 1.0)


__all__ = [
    "SyntheticSpec",
    "cold_ttft",
    "expected_speedup",
    "make_scenario",
    "prompt_tokens",
    "true_ttft",
    "with_changes",
    "write_run",
]
