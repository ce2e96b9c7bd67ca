"""Where the plan's error comes from: planned against measured, per cell, arm and component.

    .venv/bin/python bench/decomposition.py [DIR ...] [--out DIR]

Each DIR is an ``--out`` folder of ``bench/heldout_decision.py`` (default: the development
run ``runs/decomp/decision``, scenarios/decision-cpu.toml, and the second validation's
``runs/validation2b``, scenarios/validation2-cpu.toml). Per KV size it reads the merged
measured runs (``runs-SIZE/merged``) and the plan's as-given replicates
(``plans-SIZE/plan-*/configs/00-as_given*``), and per cell (placement x context x
sessions in flight) and arm (pool off / on) splits the mean session time (the sum of a
session's turns' e2e, the quantity the session gain is a ratio of; means, so the parts
add up) into:

- ``ttft``: the client's time to first token, itself split into
  - ``queue``: arrival at the replica to first scheduled,
  - ``prefill``: first scheduled to first token,
  - ``client``: the rest (transport, the client's own lateness; 0 in the plan, whose
    client is exact);
- ``decode``: first token to last (e2e - TTFT).

TTFT and decode are split per cell, from the records. TTFT's three parts are split per
block (placement x sessions in flight x arm: a block holds every context of its placement
and level, warm-ups included), as sums over the block's requests: measured, the block's
delta of vLLM's ``vllm:request_queue_time_seconds`` and
``vllm:request_prefill_time_seconds`` histograms (both replicas); planned, the simulated
records' ``server_queue_s`` and ``server_ttft_s`` (the mean over replicates). Runs
recorded before the histograms were kept have no block split (empty).

Each part's error is (planned - measured) / measured time of that arm (a session's, a
block's), so an arm's parts sum to its planned / measured - 1; the log gain error is the
OFF arm's log error minus the ON arm's. Also per cell and arm: tokens a session
recomputed and tokens it loaded from the pool, planned over measured (the cache's
behaviour).

Prints per directory the cell and block tables and names the part that carries the most
of the gain error per regime; writes ``decomposition-NAME.csv`` (cells),
``decomposition_blocks-NAME.csv`` and ``decomposition_turns-NAME.csv`` (per turn: median
TTFT and mean recomputed / pool tokens, planned and measured) into ``--out``, NAME the
directory's, and with the default directories ``docs/data/decomposition.json``. Asserts
nothing.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import polars as pl
from _docs import record

from sessiongen.records.counters import PHASES

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIRS = (ROOT / "runs" / "decomp" / "decision", ROOT / "runs" / "validation2b")
CELL = ["placement", "context_tokens", "load_level"]
#: A session's two parts (per cell), and a block's four (TTFT's three, then decode).
PARTS = ("ttft", "decode")
SUBPARTS = ("queue", "prefill", "client")
BLOCK_PARTS = (*SUBPARTS, "decode")
BLOCK = ["placement", "load_level", "cache"]


def records(paths: list[Path]) -> pl.DataFrame:
    """The ok requests of the runs at ``paths`` (warm-ups included), with recomputed and
    pool tokens and decode seconds."""
    frames = [pl.read_parquet(p) for p in paths]
    out = pl.concat(frames, how="diagonal_relaxed").filter(pl.col("status") == "ok")
    return out.with_columns(
        pool_tokens=pl.col("external_hit_tokens").fill_null(0),
        recomputed_tokens=pl.col("prompt_tokens") - pl.col("cached_tokens").fill_null(0),
        decode_s=pl.col("e2e_s") - pl.col("ttft_s"),
    )


def phase_sums(metrics: pl.DataFrame) -> pl.DataFrame:
    """Per run and block, the queue and prefill seconds summed over its requests and both
    replicas, from the histograms' before/after delta (empty where not recorded)."""
    names = {PHASES[phase][0]: f"{phase}_m" for phase in ("queue", "prefill")}
    rows = metrics.filter(
        pl.col("metric").is_in(list(names)) & pl.col("moment").is_in(["before", "after"])
    )
    schema = {"run_id": pl.String, "block": pl.Int32, "queue_m": pl.Float64,
              "prefill_m": pl.Float64}  # fmt: skip
    if rows.is_empty():
        return pl.DataFrame(schema=schema)
    delta = (
        rows.pivot(
            on="moment",
            index=["run_id", "block", "replica", "metric"],
            values="value",
            aggregate_function="first",
        )
        .with_columns(d=pl.col("after") - pl.col("before"))
        .group_by("run_id", "block", "metric")
        .agg(pl.col("d").sum())
    )
    wide = delta.pivot(on="metric", index=["run_id", "block"], values="d")
    return wide.rename(names).select(list(schema))


def sessions(reqs: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return reqs.group_by(*CELL, "cache", *keys, "session_id").agg(
        total=pl.col("e2e_s").sum(),
        ttft=pl.col("ttft_s").sum(),
        decode=pl.col("decode_s").sum(),
        recomputed=pl.col("recomputed_tokens").sum(),
        pool=pl.col("pool_tokens").sum(),
    )


def block_parts(
    measured: pl.DataFrame, metrics: pl.DataFrame, planned: pl.DataFrame
) -> pl.DataFrame:
    """Per block (module doc): each phase's seconds summed over the block's requests,
    measured (``metrics``' histograms; empty where not recorded) and planned (the mean over
    replicates), and each phase's error as a share of the measured block's e2e."""
    sums = measured.group_by("run_id", "block", *BLOCK).agg(
        ttft_m=pl.col("ttft_s").sum(),
        e2e_m=pl.col("e2e_s").sum(),
        requests=pl.len(),
    )
    sums = sums.join(phase_sums(metrics), on=["run_id", "block"], how="left").with_columns(
        client_m=pl.col("ttft_m") - pl.col("queue_m") - pl.col("prefill_m"),
        decode_m=pl.col("e2e_m") - pl.col("ttft_m"),
    )
    plan = (
        planned.group_by("run_id", *BLOCK)
        .agg(
            queue_p=pl.col("server_queue_s").sum(),
            prefill_p=(pl.col("server_ttft_s") - pl.col("server_queue_s")).sum(),
            client_p=(pl.col("ttft_s") - pl.col("server_ttft_s")).sum(),
            decode_p=pl.col("decode_s").sum(),
            e2e_p=pl.col("e2e_s").sum(),
        )
        .group_by(*BLOCK)
        .agg(pl.all().exclude("run_id").mean())
    )
    out = sums.drop("run_id", "block").join(plan, on=BLOCK)
    return out.with_columns(
        *(
            ((pl.col(f"{part}_p") - pl.col(f"{part}_m")) / pl.col("e2e_m")).alias(f"d_{part}")
            for part in BLOCK_PARTS
        ),
        arm_error=pl.col("e2e_p") / pl.col("e2e_m") - 1,
    ).sort(BLOCK)


def per_arm(sessions: pl.DataFrame, side: str) -> pl.DataFrame:
    """Mean session parts per cell and arm, columns suffixed with ``side``."""
    cols = ["total", *PARTS, "recomputed", "pool"]
    out = sessions.group_by(*CELL, "cache").agg(
        *(pl.col(c).mean() for c in cols), sessions=pl.len()
    )
    return out.rename({c: f"{c}_{side}" for c in [*cols, "sessions"]})


def decompose(out_dir: Path, size: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The cell, turn and block tables of one KV size of a heldout_decision folder."""
    merged = out_dir / f"runs-{size}" / "merged"
    plans = sorted((out_dir / f"plans-{size}").glob("plan-*/configs/00-as_given*/requests.parquet"))
    if not (merged / "requests.parquet").exists() or not plans:
        return None
    measured, planned = records([merged / "requests.parquet"]), records(plans)
    alone_m, alone_p = measured.filter(~pl.col("warmup")), planned.filter(~pl.col("warmup"))
    m = per_arm(sessions(alone_m, ["block"]), "m")
    cells = m.join(per_arm(sessions(alone_p, ["run_id", "block"]), "p"), on=[*CELL, "cache"])
    cells = cells.with_columns(
        *(
            ((pl.col(f"{part}_p") - pl.col(f"{part}_m")) / pl.col("total_m")).alias(f"d_{part}")
            for part in PARTS
        ),
        arm_error=pl.col("total_p") / pl.col("total_m") - 1,
        kv=pl.lit(size),
    )
    turns = turn_table(alone_m, alone_p).with_columns(kv=pl.lit(size))
    metrics = pl.read_parquet(merged / "metrics.parquet")
    blocks = block_parts(measured, metrics, planned).with_columns(kv=pl.lit(size))
    return cells, turns, blocks


def turn_table(measured: pl.DataFrame, planned: pl.DataFrame) -> pl.DataFrame:
    """Per cell, arm and turn: median TTFT, mean recomputed and pool tokens, both sides."""

    def side(reqs: pl.DataFrame, tag: str) -> pl.DataFrame:
        return reqs.group_by(*CELL, "cache", "turn").agg(
            pl.col("ttft_s").median().alias(f"ttft_p50_{tag}"),
            pl.col("recomputed_tokens").mean().alias(f"recomputed_{tag}"),
            pl.col("pool_tokens").mean().alias(f"pool_{tag}"),
        )

    joined = side(measured, "m").join(side(planned, "p"), on=[*CELL, "cache", "turn"])
    return joined.sort(*CELL, "cache", "turn")


def gain_rows(frame: pl.DataFrame, keys: list[str], parts: tuple[str, ...]) -> pl.DataFrame:
    """Per group of ``keys``: the log gain error (the OFF arm's log(planned / measured)
    minus the ON arm's) and each part's share of it (an arm's log error split in
    proportion to its parts' errors; ON's negated); token ratios where the frame has
    them."""
    rows = []
    for key, sub in frame.group_by(keys):
        arms = {r["cache"]: r for r in sub.iter_rows(named=True)}
        if set(arms) != {"off", "on"}:
            continue
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        total = 0.0
        for arm, sign in (("off", 1.0), ("on", -1.0)):
            r = arms[arm]
            log_error = math.log1p(r["arm_error"])
            scale = log_error / r["arm_error"] if r["arm_error"] else 1.0
            for part in parts:
                share = r[f"d_{part}"]
                row[f"{part}_{arm}"] = None if share is None else sign * scale * share
            total += sign * log_error
            row[f"error_{arm}"] = r["arm_error"]
            if "recomputed_p" in r:
                row[f"recomputed_ratio_{arm}"] = ratio(r["recomputed_p"], r["recomputed_m"])
                row[f"pool_ratio_{arm}"] = ratio(r["pool_p"], r["pool_m"])
        row["log_gain_error"] = total
        rows.append(row)
    return pl.DataFrame(rows).sort(keys)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


#: The two regimes, by the sessions in flight.
REGIMES = {"one in flight": pl.col("load_level") <= 1, "loaded": pl.col("load_level") > 1}


def _mean(column: pl.Series) -> float:
    value = column.mean()
    assert isinstance(value, float)
    return value


def carriers(gain: pl.DataFrame, parts: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per regime: the mean share of each part and arm in the log gain error (a bias
    shows as a mean away from 0), and the largest of them."""
    out = []
    for name, where in REGIMES.items():
        sub = gain.filter(where)
        columns = [f"{p}_{a}" for p in parts for a in ("off", "on")]
        if sub.is_empty() or any(sub[c].null_count() for c in columns):
            continue
        shares = {c: _mean(sub[c]) for c in columns}
        top = max(shares, key=lambda k: abs(shares[k]))
        out.append(
            {
                "regime": name,
                "groups": sub.height,
                "mean_log_gain_error": _mean(sub["log_gain_error"]),
                "mean_abs_log_gain_error": _mean(sub["log_gain_error"].abs()),
                "shares": shares,
                "largest": top,
            }
        )
    return out


def show(title: str, gain: pl.DataFrame, parts: tuple[str, ...]) -> list[dict[str, Any]]:
    """Print ``gain`` and its per-regime carriers; the carriers."""
    print(f"\n{title}")
    cols = [c for c in gain.columns if not c.startswith("error_")]
    with pl.Config(tbl_rows=64, tbl_cols=32, float_precision=3, tbl_width_chars=250):
        print(gain.select(cols))
    summary = carriers(gain, parts)
    for s in summary:
        print(
            f"  {s['regime']}: {s['groups']} groups, mean log gain error "
            f"{s['mean_log_gain_error']:+.3f} (mean |.| {s['mean_abs_log_gain_error']:.3f}); "
            f"largest mean part {s['largest']} {s['shares'][s['largest']]:+.3f}"
        )
    return summary


def flat(name: str, table: str, summary: list[dict[str, Any]]) -> dict[str, Any]:
    """A table's per-regime carriers as flat figures: ``NAME.TABLE.REGIME.FIELD``."""
    out: dict[str, Any] = {}
    for s in summary:
        key = f"{name}.{table}.{s['regime'].replace(' ', '_')}"
        out[f"{key}.groups"] = s["groups"]
        out[f"{key}.mean_log_gain_error"] = _round(s["mean_log_gain_error"])
        out[f"{key}.mean_abs_log_gain_error"] = _round(s["mean_abs_log_gain_error"])
        out[f"{key}.largest"] = s["largest"]
        out |= {f"{key}.share.{k}": _round(v) for k, v in s["shares"].items()}
    return out


def row_figures(prefix: str, gain: pl.DataFrame, keys: list[str]) -> dict[str, Any]:
    """Each row of ``gain`` as flat figures: ``PREFIX.KEY1.KEY2....COLUMN``."""
    out: dict[str, Any] = {}
    for r in gain.iter_rows(named=True):
        where = ".".join(f"{r[k]:g}" if isinstance(r[k], float) else str(r[k]) for k in keys)
        out |= {f"{prefix}.{where}.{c}": _round(v) for c, v in r.items() if c not in keys}
    return out


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=list(DEFAULT_DIRS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "decomp")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {}
    for folder in args.dirs:
        kept = [d for d in (decompose(folder, size) for size in ("large", "small")) if d]
        if not kept:
            print(f"{folder}: no merged runs and plans of heldout_decision.py here")
            continue
        frames = (pl.concat(f, how="diagonal_relaxed") for f in zip(*kept, strict=True))
        cells, turns, blocks = frames
        name = folder.name
        cell_gain = gain_rows(cells, ["kv", *CELL], PARTS)
        block_gain = gain_rows(blocks, ["kv", "placement", "load_level"], BLOCK_PARTS)
        cell_summary = show(f"{name}, per cell: the session-gain error's parts", cell_gain, PARTS)
        block_summary = show(
            f"{name}, per block (every context of a placement and level, warm-ups included): "
            "the block-time gain error's parts",
            block_gain,
            BLOCK_PARTS,
        )
        found |= flat(name, "cells", cell_summary)
        found |= flat(name, "blocks", block_summary)
        found |= row_figures(f"{name}.cell", cell_gain, ["kv", *CELL])
        found |= row_figures(f"{name}.block", block_gain, ["kv", "placement", "load_level"])
        cells.write_csv(args.out / f"decomposition-{name}.csv")
        blocks.write_csv(args.out / f"decomposition_blocks-{name}.csv")
        turns.write_csv(args.out / f"decomposition_turns-{name}.csv")
    documented = argparse.Namespace(dirs=list(DEFAULT_DIRS), out=ROOT / "runs" / "decomp")
    if found:
        record("decomposition", found, args=args, documented=documented)


if __name__ == "__main__":
    main()
