"""One arm of a two-arm run, as a single-arm run of given endpoints would record it.

``replay --endpoints A,B --cache off`` runs only the design's OFF blocks, numbered
0, 1, ... in execution order and within each placement and level; its manifest names
target kind ``endpoints`` and its arm. :func:`split_arm` writes that run folder from a
two-arm run, so that merging the two halves back can be compared with the whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen.records import io


def split_arm(run_dir: Path, arm: str, out_root: Path) -> Path:
    """Write the ``arm`` half of ``run_dir`` under ``out_root``; its path."""
    manifest: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    run_id = f"{manifest['run_id']}-{arm}"
    kept = [b for b in manifest["blocks"] if b["cache"] == arm]
    new_block = {b["block"]: n for n, b in enumerate(kept)}
    within: dict[int, int] = {}
    seen: dict[str, int] = {}
    for b in kept:  # one level per placement in the runs split here
        within[b["block"]] = seen.get(b["placement"], 0)
        seen[b["placement"]] = within[b["block"]] + 1
    out = out_root / run_id
    out.mkdir(parents=True)

    def renumber(frame: pl.DataFrame) -> pl.DataFrame:
        frame = frame.filter(pl.col("cache") == arm)
        cols = [
            pl.col("block").replace_strict(new_block, return_dtype=pl.Int32),
            pl.lit(run_id).alias("run_id"),
        ]
        if "block_in_placement" in frame.columns:
            cols.append(
                pl.col("block")
                .replace_strict(within, return_dtype=pl.Int32)
                .alias("block_in_placement")
            )
        return frame.with_columns(cols)

    io.atomic_write_parquet(
        out / "requests.parquet", renumber(pl.read_parquet(run_dir / "requests.parquet"))
    )
    if (run_dir / "metrics.parquet").is_file():
        metrics = pl.read_parquet(run_dir / "metrics.parquet")
        io.atomic_write_parquet(out / "metrics.parquet", renumber(metrics))
    blocks = [
        {**b, "block": new_block[b["block"]], "block_in_placement": within[b["block"]]}
        for b in kept
    ]
    manifest.update(
        run_id=run_id,
        blocks=blocks,
        block_order=[{"placement": b["placement"], "cache": arm} for b in blocks],
        target={**manifest["target"], "cache": arm},
    )
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out
