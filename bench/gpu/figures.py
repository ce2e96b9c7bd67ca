"""The figures the docs quote from a GPU run folder: docs/data/gpu_run.json.

    .venv/bin/python bench/gpu/figures.py [--run-folder bench/gpu/2026-12-07]

Reads what `scripts/gpu/collect.sh` brought back and what `bench/gpu/heldout.py` and
`bench/gpu/equivalence.py` derive from it (run heldout.py first: it writes heldout.csv):
the GPU (facts.txt), the 8B model's size, the median cross-replica TTFT of the probe
chains at each context with the pool off and on (turn 4, moved to the other replica),
the six-turn study's first cross-replica turn (turn 2), the held-out cells planned against
measured, the equivalence pairs by how the prefix was served, the pool-off arm's own
answers across placements, and (from the folder's ``-chunk16`` sibling, the rerun with
16-token LMCache chunks) its pairs. Prints them; with the documented
settings (the default folder) writes them for the docs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import polars as pl
from equivalence import pairs, split_null

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _docs import record  # noqa: E402

from sessiongen.records.io import read_meta  # noqa: E402


def run_named(folder: Path, scenario: str, model: str) -> Path:
    for run in sorted((folder / "runs").iterdir()):
        meta = read_meta(run)
        if meta.scenario["name"] == scenario and meta.target["spec"]["model"] == model:
            return run
    raise SystemExit(f"{folder}: no {scenario} run of {model}")


def medians(run: Path, turn: int) -> dict[str, float]:
    df = pl.read_parquet(run / "requests.parquet").filter(
        ~pl.col("warmup"), pl.col("status") == "ok", pl.col("turn") == turn
    )
    out = df.group_by("placement", "context_tokens", "cache").agg(pl.col("ttft_s").median())
    return {
        f"{r['placement']}.{r['context_tokens']}.{r['cache']}": round(r["ttft_s"], 3)
        for r in out.iter_rows(named=True)
    }


def figures(folder: Path) -> dict[str, Any]:
    facts = (folder / "facts.txt").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(facts) if line.startswith("{"))
    end = next(i for i, line in enumerate(facts) if line.startswith("}"))
    stack = json.loads("\n".join(facts[start : end + 1]))
    probe = run_named(folder, "fitprobe", "builtin:llama-8b")
    study = run_named(folder, "alt32k", "builtin:llama-8b")
    out: dict[str, Any] = {
        "gpu": facts[1].split(",")[0].strip(),
        "vllm": stack["versions"]["vllm"],
        "lmcache": stack["versions"]["lmcache"],
        "model8b.parameters_b": round(stack["models"]["builtin:llama-8b"]["parameters"] / 1e9, 2),
        "probe.run": probe.name,
        "study.run": study.name,
    }
    for key, value in medians(probe, 4).items():
        out[f"probe.xreplica.{key.split('.', 1)[1]}"] = value
    for key, value in medians(study, 2).items():
        out[f"study.turn2.{key}"] = value
    held = pl.read_csv(folder / "heldout.csv")
    for row in held.iter_rows(named=True):
        p = row["placement"]
        for side in ("measured", "planned"):
            for end_ in ("", "_low", "_high"):
                out[f"heldout.{p}.{side}{end_}"] = round(row[f"session_gain_{side}{end_}"], 3)
        out[f"heldout.{p}.error"] = round(row["session_gain_error"], 3)
        out[f"heldout.{p}.sessions"] = row["sessions_measured"]
        out[f"heldout.{p}.verdict_measured"] = row["verdict_measured"]
    for run in sorted((folder / "runs").iterdir()):
        name = read_meta(run).target["spec"]["model"].split(":")[-1].replace("-", "")
        scen = read_meta(run).scenario["name"]
        table = pairs(run / "requests.parquet").group_by("prefix").agg(
            pl.len().alias("pairs"), pl.col("differs").sum().alias("differ"),
            pl.col("ulps").max().alias("ulps_max"),
        )  # fmt: skip
        for row in table.iter_rows(named=True):
            key = f"equivalence.{scen}_{name}.{row['prefix'].replace('+', '_')}"
            out[f"{key}.pairs"], out[f"{key}.differ"] = row["pairs"], row["differ"]
            out[f"{key}.ulps_max"] = round(row["ulps_max"], 1)
    null = split_null(study / "requests.parquet")
    assert null is not None
    out["split_null.pairs"], out["split_null.differ"] = null.row(0)
    chunk16 = folder.parent / f"{folder.name}-chunk16"
    if chunk16.is_dir():
        run = run_named(chunk16, "alt32k", "builtin:llama-1b")
        table = pairs(run / "requests.parquet").group_by("prefix").agg(
            pl.len().alias("pairs"), pl.col("differs").sum().alias("differ")
        )  # fmt: skip
        for row in table.iter_rows(named=True):
            key = f"chunk16.{row['prefix'].replace('+', '_')}"
            out[f"{key}.pairs"], out[f"{key}.differ"] = row["pairs"], row["differ"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ROOT / "bench/gpu/2026-12-07"
    parser.add_argument("--run-folder", type=Path, default=default)
    args = parser.parse_args()
    found = figures(args.run_folder)
    print(json.dumps(found, indent=1))
    record("gpu_run", found, args=args, documented=argparse.Namespace(run_folder=default))


if __name__ == "__main__":
    main()
