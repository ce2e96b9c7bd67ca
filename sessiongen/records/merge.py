"""Runs of one design's different arms combined into one run folder (``sessiongen merge``).

Replicas whose arm is stated for the whole run (``--endpoints A,B --cache off``) record
one arm per run. Runs of the same scenario, seed and target, each holding other arms,
combine into a new run folder that reads as one run of the whole design: a run's k-th
block of an arm takes the place of the design's k-th block of that arm, per placement
and load level, so two single-arm runs of OFF, ON, ON, OFF are numbered exactly as one
two-arm run is. Requests and counters keep every value; their ``block`` and
``block_in_placement`` are renumbered and ``run_id`` is the new run's. The manifest
keeps what the runs share, each run's target under ``target.merged_from``, and each
block's origin (``source_run``, ``source_block``).

Refused with one line (:class:`RunDirError`): fewer than two runs; scenarios, seeds,
tokenizers or targets that differ (target kind, time scale, replica count, simulator
profile, managed spec, server versions); two runs that hold the same arm; a run whose
blocks do not follow the scenario's design.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import polars as pl

from sessiongen.errors import RunDirError
from sessiongen.infra.files import ensure_dir, output_error
from sessiongen.records import io
from sessiongen.records.format import SCHEMA_VERSION, BlockEntry, Manifest, TargetInfo

#: Target facts that must agree between merged runs (where either run has them).
TARGET_KEYS = ("kind", "simulated", "time_scale", "profile", "spec")

Slot = tuple[str, int, str]  # (placement, level index, cache) of one design position


def _design(scenario: Mapping[str, Any]) -> list[Slot]:
    """Every block of the scenario's whole design, in the order a replay runs them."""
    design = scenario.get("design") or {}
    load = scenario.get("load") or {}
    levels = len(load.get("levels") or ()) or 1
    return [
        (str(policy), level, str(cache))
        for policy in (scenario.get("placement") or {}).get("policies") or ()
        for level in range(levels)
        for cache in design.get("blocks") or ()
    ]


def _replicas(target: Mapping[str, Any]) -> int:
    return int(target.get("replicas") or len(target.get("endpoints") or ()))


def _versions(target: Mapping[str, Any]) -> list[str]:
    """What the servers answered on ``/version``, as sorted JSON texts."""
    servers = [s for s in target.get("servers") or [] if isinstance(s, dict)]
    return sorted({json.dumps(s.get("version"), sort_keys=True) for s in servers})


def _differs(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """What makes two manifests not one design (None: nothing)."""
    if a.get("seed") != b.get("seed"):
        return f"seed {b.get('seed')} differs from {a.get('seed')}"
    if a.get("scenario_digest") != b.get("scenario_digest"):
        return (
            f"scenario differs (digest {b.get('scenario_digest')} against "
            f"{a.get('scenario_digest')}): sessions, design or load are not the same"
        )
    for key in ("tokenizer", "text_generator"):
        if a.get(key) != b.get(key):
            return f"{key} {b.get(key)} differs from {a.get(key)}"
    ta, tb = a.get("target") or {}, b.get("target") or {}
    for key in TARGET_KEYS:
        if (key in ta or key in tb) and ta.get(key) != tb.get(key):
            shown = [json.dumps(t.get(key), sort_keys=True)[:60] for t in (tb, ta)]
            return f"target differs: {key} {shown[0]} against {shown[1]}"
    if _replicas(ta) != _replicas(tb):
        return f"target differs: {_replicas(tb)} replicas against {_replicas(ta)}"
    if _versions(ta) != _versions(tb):
        return f"target differs: server versions {_versions(tb)} against {_versions(ta)}"
    return None


def _arms(manifest: Mapping[str, Any]) -> set[str]:
    return {str(b.get("cache")) for b in manifest.get("blocks") or []}


def _places(path: Path, manifest: Mapping[str, Any], design: list[Slot]) -> dict[int, int]:
    """A run's block index -> its position in the whole design (module doc)."""
    arms = _arms(manifest)
    expected = [i for i, slot in enumerate(design) if slot[2] in arms]
    blocks = sorted(manifest.get("blocks") or [], key=lambda b: int(b["block"]))
    if len(blocks) > len(expected):
        raise RunDirError(f"{path}: {len(blocks)} blocks, more than the design's {len(expected)}")
    out = {}
    for entry, position in zip(blocks, expected, strict=False):
        placement, _level, cache = design[position]
        if (entry.get("placement"), entry.get("cache")) != (placement, cache):
            raise RunDirError(
                f"{path}: block {entry.get('block')} is {entry.get('placement')}/"
                f"{entry.get('cache')} where the design has {placement}/{cache}"
            )
        out[int(entry["block"])] = position
    return out


def _renumber(
    frame: pl.DataFrame, blocks: Mapping[int, tuple[int, int]], run_id: str
) -> pl.DataFrame:
    """``block`` (and ``block_in_placement``) as in the merged run; ``run_id`` the new one."""
    old = pl.col("block").cast(pl.Int64)
    new = {k: v[0] for k, v in blocks.items()}
    within = {k: v[1] for k, v in blocks.items()}
    unknown = set(frame["block"].unique().to_list()) - set(new)
    if unknown:
        raise RunDirError(f"records of blocks {sorted(unknown)} that the manifest does not list")
    cols = [
        old.replace_strict(new, return_dtype=pl.Int32).alias("block"),
        pl.lit(run_id).alias("run_id"),
    ]
    if "block_in_placement" in frame.columns:
        cols.append(old.replace_strict(within, return_dtype=pl.Int32).alias("block_in_placement"))
    return frame.with_columns(cols)


def _target(manifests: Sequence[Mapping[str, Any]]) -> TargetInfo:
    """What the runs' targets share, plus every server and every run's whole target."""
    targets = [dict(m.get("target") or {}) for m in manifests]
    first = targets[0]
    shared = {k: v for k, v in first.items() if all(t.get(k) == v for t in targets[1:])}
    servers, blocks = [], []
    for manifest, target in zip(manifests, targets, strict=True):
        arms = sorted(_arms(manifest))
        for server in target.get("servers") or []:
            if isinstance(server, dict):
                servers.append({"arm": arms[0] if len(arms) == 1 else None, **server})
        blocks += [b for b in target.get("blocks") or [] if isinstance(b, dict)]
    shared.update(servers=servers, blocks=blocks)
    shared["merged_from"] = [
        {"run_id": m.get("run_id"), "arms": sorted(_arms(m)), "target": t}
        for m, t in zip(manifests, targets, strict=True)
    ]
    return cast(TargetInfo, shared)  # the runs' targets as read: JSON of any version


def merge_runs(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> Path:
    """Combine runs of one design's different arms into a new run folder (module doc);
    its path. ``out_dir`` defaults to a new run id beside the first run."""
    paths = [Path(d) for d in run_dirs]
    if len(paths) < 2:
        raise RunDirError("merge: expected two or more run folders (one per arm)")
    manifests = [io.read_manifest(p) for p in paths]
    first = manifests[0]
    for path, manifest in zip(paths[1:], manifests[1:], strict=True):
        why = _differs(first, manifest)
        if why:
            raise RunDirError(f"{path}: {why} ({paths[0]}); runs of one design only")
    seen: dict[str, Path] = {}
    for path, manifest in zip(paths, manifests, strict=True):
        for arm in sorted(_arms(manifest)):
            if arm in seen:
                raise RunDirError(f"{path}: holds cache arm {arm}, as {seen[arm]} does")
            seen[arm] = path
    design = _design(first.get("scenario") or {})
    places = [_places(p, m, design) for p, m in zip(paths, manifests, strict=True)]
    taken = sorted(pos for run in places for pos in run.values())
    rank = {pos: n for n, pos in enumerate(taken)}
    within = _within_placement(design)
    run_id = io.new_run_id(f"{first.get('scenario_name', 'run')}-merged")
    out = Path(out_dir) if out_dir is not None else paths[0].parent / run_id
    if out.exists():
        raise RunDirError(f"{out}: exists; merge writes a new run folder")
    try:
        ensure_dir(out.parent)
        out.mkdir()
    except OSError as exc:
        raise output_error(out, exc) from None
    requests, metrics, entries = [], [], []
    for path, manifest, place in zip(paths, manifests, places, strict=True):
        blocks = {old: (rank[pos], within[pos]) for old, pos in place.items()}
        requests.append(_renumber(io.read_requests(path), blocks, run_id))
        if (path / "metrics.parquet").is_file():
            metrics.append(_renumber(pl.read_parquet(path / "metrics.parquet"), blocks, run_id))
        for entry in manifest.get("blocks") or []:
            new, inside = blocks[int(entry["block"])]
            merged: BlockEntry = {**entry, "block": new, "block_in_placement": inside}
            merged["source_run"], merged["source_block"] = (
                str(manifest.get("run_id")),
                int(entry["block"]),
            )
            entries.append(merged)
    entries.sort(key=lambda e: e["block"])
    manifest_out: Manifest = {
        **first,
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "salt": "+".join(str(m.get("salt")) for m in manifests),
        "target": _target(manifests),
        "block_order": [{"placement": e["placement"], "cache": e["cache"]} for e in entries],
        "blocks": entries,
        "started_at": min(str(m.get("started_at") or "") for m in manifests),
        "ended_at": max(str(m.get("ended_at") or "") for m in manifests) or None,
        "complete": all(m.get("complete") is True for m in manifests),
        "merged_from": [
            {"run_id": m.get("run_id"), "path": str(p), "arms": sorted(_arms(m))}
            for p, m in zip(paths, manifests, strict=True)
        ],
    }
    manifest_out.pop("loop_lag", None)  # the runs' own, not the merged run's
    manifest_out.pop("calibration", None)
    io.atomic_write_parquet(out / "requests.parquet", pl.concat(requests, how="diagonal_relaxed"))
    if metrics:
        io.atomic_write_parquet(out / "metrics.parquet", pl.concat(metrics, how="diagonal_relaxed"))
    io.write_manifest(out, manifest_out)
    return out


def _within_placement(design: list[Slot]) -> dict[int, int]:
    """Design position -> the block's index within its placement and level."""
    out: dict[int, int] = {}
    count: dict[tuple[str, int], int] = {}
    for pos, (placement, level, _cache) in enumerate(design):
        out[pos] = count.get((placement, level), 0)
        count[(placement, level)] = out[pos] + 1
    return out
