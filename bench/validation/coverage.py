"""The pre-registered validation's metric (bench/validation/PROTOCOL.md) from a run of
bench/heldout_decision.py: coverage of the planned 95% interval over the measured session
gain per regime, with Clopper-Pearson intervals, and verdict agreement in decided cells.

    .venv/bin/python bench/validation/coverage.py OUT_DIR

Reads ``OUT_DIR/heldout_decision.parquet``. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl
from scipy import stats as sps


def clopper_pearson(hits: int, n: int) -> tuple[float, float]:
    """The exact binomial 95% interval of ``hits`` of ``n`` (Clopper & Pearson 1934)."""
    if n == 0:
        return float("nan"), float("nan")
    low = float(sps.beta.ppf(0.025, hits, n - hits + 1)) if hits else 0.0
    high = float(sps.beta.ppf(0.975, hits + 1, n - hits)) if hits < n else 1.0
    return low, high


def metric(table: pl.DataFrame) -> pl.DataFrame:
    """Per regime and overall: cells, covered, coverage [CP], decided (by the
    measurement), right, wrong (the plan decided otherwise), undecided, the median and
    worst |session-gain error|."""
    cells = table.with_columns(
        pl.when(pl.col("load_level") <= 1).then(pl.lit("one in flight"))
        .otherwise(pl.lit("loaded")).alias("regime"),
        pl.col("session_gain_measured").is_between(
            pl.col("session_gain_planned_low"), pl.col("session_gain_planned_high")
        ).alias("covered"),
        pl.col("verdict_measured").is_in(["pays", "does not pay"]).alias("decided"),
    )  # fmt: skip
    rows = []
    for name, part in [*cells.group_by("regime"), (("all",), cells)]:
        n, hit = part.height, int(part["covered"].sum())
        low, high = clopper_pearson(hit, n)
        decided = part.filter(pl.col("decided"))
        rows.append({
            "regime": name[0], "cells": n, "covered": hit, "coverage": hit / n if n else None,
            "coverage_low": low, "coverage_high": high, "decided": decided.height,
            "right": int((decided["verdict_planned"] == decided["verdict_measured"]).sum()),
            "wrong": int(decided.filter(
                pl.col("verdict_planned").is_in(["pays", "does not pay"])
                & (pl.col("verdict_planned") != pl.col("verdict_measured"))
            ).height),
            "planned_undecided": int((decided["verdict_planned"] == "undecided").sum()),
            "median_abs_error": part["session_gain_error"].abs().median(),
            "worst_abs_error": part["session_gain_error"].abs().max(),
        })  # fmt: skip
    return pl.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    table = pl.read_parquet(args.out / "heldout_decision.parquet")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, float_precision=3):
        print(metric(table))


if __name__ == "__main__":
    main()
