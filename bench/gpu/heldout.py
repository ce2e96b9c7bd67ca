"""The GPU profile and its held-out cells: fit the H100 probe chains, plan the six-turn study.

    .venv/bin/python bench/gpu/heldout.py [--run-folder bench/gpu/2026-12-07] [--seeds 10]
        [--write-profile]

Reads the runs `scripts/gpu/run.sh` brought back (no GPU needed): the probe chains
(scenarios/fitprobe.toml on builtin:llama-8b, 8k-128k, both arms) and the six-turn study
(scenarios/alt32k.toml, alternate and fixed, both arms). Fits the simulator on the probe
chains alone, plans the study's own scenario with that profile on the replicas' structure
(KV cache, scheduler limits, pool chunk and size, from the run's manifest), as ``sessiongen
fit --heldout`` does, and prints per cell the measured and the
planned session gain with their 95% intervals (sessions the unit), the error planned /
measured - 1 and both verdicts (:mod:`sessiongen.capacity.heldout`); writes
``heldout.csv`` into the run folder. The study was not seen by the fit, so the table is
the profile's held-out check, as measured.

``--write-profile`` then writes the shipped profile
(``sessiongen/scenario/profiles/h100-llama8b.toml``): the same fit, with the study as
its held-out runs (``sessiongen fit --heldout``), so the planner's intervals carry the
model error measured on them. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import polars as pl

from sessiongen.capacity import fit, modelerror
from sessiongen.records.io import read_meta

ROOT = Path(__file__).resolve().parent.parent.parent
PROFILE = ROOT / "sessiongen" / "scenario" / "profiles" / "h100-llama8b.toml"
SHOWN = [
    "placement", "context_tokens", "load_level", "sessions_measured",
    "session_gain_measured", "session_gain_measured_low", "session_gain_measured_high",
    "session_gain_planned", "session_gain_planned_low", "session_gain_planned_high",
    "session_gain_error", "later_gain_measured", "later_gain_planned", "later_gain_error",
    "verdict_measured", "verdict_planned",
]  # fmt: skip


def runs(folder: Path) -> tuple[Path, Path]:
    """(the 8B probe run, the 8B study run) in a collected GPU folder."""
    found: dict[str, Path] = {}
    for run in sorted((folder / "runs").iterdir()):
        meta = read_meta(run)
        model = (meta.target.get("spec") or {}).get("model")
        if model == "builtin:llama-8b":
            found[meta.scenario["name"]] = run
    return found["fitprobe"], found["alt32k"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-folder", type=Path, default=ROOT / "bench/gpu/2026-12-07")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--write-profile", action="store_true")
    args = parser.parse_args()
    probe, study = runs(args.run_folder)
    with tempfile.TemporaryDirectory() as tmp:
        result = fit.fit_runs([probe])
        profile = fit.write_profile(result, Path(tmp) / "probe-only.toml")
        table = modelerror.heldout_table(profile, study, Path(tmp), replicates=args.seeds)
    out = args.run_folder / "heldout.csv"
    table.write_csv(out)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, float_precision=3):
        print(f"fit on {probe.name}; held out {study.name}; {args.seeds} plan replicates")
        print(table.select(SHOWN))
    print(f"written {out.relative_to(ROOT)}")
    if args.write_profile:
        shipped = fit.with_model_error(result, [study], replicates=args.seeds)
        fit.write_profile(shipped, PROFILE)
        PROFILE.write_text(header(args.run_folder, study) + PROFILE.read_text(encoding="utf-8"))
        print(f"written {PROFILE.relative_to(ROOT)}")


def header(folder: Path, study: Path) -> str:
    """What the shipped profile was fitted on, from the run's own files (facts.txt: the GPU)."""
    gpu = (folder / "facts.txt").read_text(encoding="utf-8").splitlines()[1].strip()
    spec = read_meta(study).target["spec"]
    lines = [
        "builtin:h100-llama8b: the simulator fitted to a real GPU pair: two vLLM replicas of",
        f"{spec['model']} (Llama-3-8B's shape, bfloat16, random weights) sharing one GPU",
        f"({gpu}), each with the arguments {' '.join(spec['vllm_args'])},",
        f"one LMCache server with a {spec['pool_size_gb']} GB pool in host memory, "
        f"{spec['chunk_size']}-token chunks.",
        f"Runs and facts: {folder.relative_to(ROOT)}; written by "
        "`.venv/bin/python bench/gpu/heldout.py --write-profile`.",
        "",
        "    --set target.sim.profile=builtin:h100-llama8b",
        "",
    ]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


if __name__ == "__main__":
    main()
