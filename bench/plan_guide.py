"""The "Plan my fleet" guide's excerpt: its first command, run as the guide gives it, and
the decision rows it printed, into ``docs/data/plan_guide.json``.

    python bench/plan_guide.py

Runs ``sessiongen plan scenarios/alt32k.toml --vary target.sim.replicas=2,4
--no-sensitivity`` in a temporary runs folder and records, per replicas value and
placement, the session gain, its 95% interval and the verdict as the console shows it
(``r2.alternate.gain``, ``.low``, ``.high``, ``.verdict``). Prints them; asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
from _docs import ROOT, record  # a sibling: bench/ is the script's own folder

COMMAND = [
    "plan", "scenarios/alt32k.toml", "--vary", "target.sim.replicas=2,4", "--no-sensitivity",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "sessiongen", *COMMAND, "--runs-dir", tmp]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
        print(done.stdout)
        (plan,) = Path(tmp).glob("plan-*")
        whatif = pl.read_parquet(plan / "whatif.parquet")
        configs = {0: 2, 1: 4}  # the --vary values in grid order
        figures: dict[str, object] = {}
        for r in whatif.iter_rows(named=True):
            key = f"r{configs[r['config']]}.{r['placement']}"
            figures[f"{key}.gain"] = r["session_gain"]
            figures[f"{key}.low"] = r["session_gain_low"]
            figures[f"{key}.high"] = r["session_gain_high"]
            figures[f"{key}.verdict"] = r["verdict_text"] or r["verdict"]
    for k, v in figures.items():
        print(f"{k}: {v}")
    record("plan_guide", figures, args=args, documented=parser.parse_args([]))


if __name__ == "__main__":
    main()
