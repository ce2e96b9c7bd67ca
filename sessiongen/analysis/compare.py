"""Compare two runs of the same scenario: is run B slower than run A, and by how much?

For each cell (placement, cache, context size, turn) present in either run:

- ``ratio`` = median TTFT(B) / median TTFT(A), in modeled seconds, with a percentile
  bootstrap interval (each run resampled on its own: the runs are independent);
- a Mann-Whitney U test of B against A (two-sided, or one-sided "B slower"), suited to
  skewed latencies, and its effect size ``prob_b_slower`` = P(B > A) + P(B = A) / 2;
- ``p_holm``: the p-values adjusted with Holm-Bonferroni across all cells, so that
  testing many cells does not by itself produce a "significant" slowdown.

A cell is a **regression** when ``ratio > 1 + threshold`` (default 5%) and ``p_holm <
alpha``; an **improvement** when ``ratio < 1 - threshold`` and ``p_holm < alpha``. The
verdict is ``"regression"`` if any cell regressed, else ``"improvement"`` if any cell
improved, else ``"no change"``. Runs whose ``scenario_digest`` differ are refused
unless ``force=True``: their cells would not measure the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis import stats
from sessiongen.analysis.frames import finite_or_none, frame_from_rows, partition, sample
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.errors import RunDirError
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

Verdict = Literal["regression", "improvement", "no change"]

COMPARE_VALUES: dict[str, pl.DataType] = {
    "n_a": pl.Int64(),
    "n_b": pl.Int64(),
    "median_a_s": pl.Float64(),
    "median_b_s": pl.Float64(),
    "ratio": pl.Float64(),
    "ratio_ci_low": pl.Float64(),
    "ratio_ci_high": pl.Float64(),
    "p_value": pl.Float64(),
    "prob_b_slower": pl.Float64(),
}


@dataclass(frozen=True)
class Comparison:
    """The per-cell comparison frame, the verdict, and notes on how the runs differ."""

    frame: pl.DataFrame
    verdict: Verdict
    threshold: float
    alpha: float
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: the verdict and how many cells moved."""
        slower = int(self.frame["regression"].sum())
        faster = int(self.frame["improvement"].sum())
        return (
            f"{self.verdict}: {slower} of {self.frame.height} cells slower and {faster} "
            f"faster by more than {self.threshold:.0%} (Holm-adjusted p < {self.alpha})"
        )

    def to_text(self) -> str:
        """The frame as a plain-text table (modeled seconds), then notes and the summary."""
        cols = ["median_a_s", "median_b_s", "ratio", "ratio_ci_low", "ratio_ci_high", "p_holm"]
        lines = ["cell                              A (s)    B (s)   B/A   CI              p_holm"]
        for row in self.frame.iter_rows(named=True):
            cell = f"{row['placement']}/{row['cache']}/{row['context_tokens']}/t{row['turn']}"
            vals = [_fmt(row[c]) for c in cols]
            mark = " REGRESSION" if row["regression"] else (" faster" if row["improvement"] else "")
            lines.append(
                f"{cell:<32} {vals[0]:>7} {vals[1]:>8} {vals[2]:>5}  [{vals[3]}, {vals[4]}]"
                f"  {vals[5]}{mark}"
            )
        return "\n".join([*lines, *self.notes, self.summary()])


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.3f}"


def _check_comparable(run_a: Run, run_b: Run, force: bool) -> tuple[str, ...]:
    """Refuse different scenarios unless forced; note other differences that matter."""
    da, db = run_a.meta.scenario_digest, run_b.meta.scenario_digest
    if da != db and not force:
        raise RunDirError(
            f"{run_b.path}: scenario_digest {db} differs from {run_a.path.name}'s {da}; "
            "use --force to compare anyway"
        )
    notes = []
    if da != db:
        notes.append(f"note: scenario digests differ ({da} vs {db}); compared because forced")
    for label, va, vb in (
        ("target", run_a.target_label, run_b.target_label),
        ("sessiongen version", run_a.meta.sessiongen_version, run_b.meta.sessiongen_version),
    ):
        if va != vb:
            notes.append(f"note: {label} differs: A {va}, B {vb}")
    for r, name in ((run_a, "A"), (run_b, "B")):
        if r.meta.complete is False:
            notes.append(f"note: run {name} ({r.run_id}) is incomplete")
    return tuple(notes)


def _median(values: NDArray[np.float64]) -> float | None:
    return float(np.median(values)) if values.size else None


def _cells(run_a: Run, run_b: Run, alternative: str, boot: Bootstrap) -> list[dict[str, Any]]:
    """One comparison row per cell present in either run."""
    side_a = {tuple(k.values()): sample(sub) for k, sub in partition(run_a.ok, CELL_KEYS)}
    side_b = {tuple(k.values()): sample(sub) for k, sub in partition(run_b.ok, CELL_KEYS)}
    alt: Literal["two-sided", "b-greater"] = (
        "b-greater" if alternative == "b-slower" else "two-sided"
    )
    rows = []
    for key in sorted(set(side_a) | set(side_b), key=str):
        xa, xb = side_a.get(key, np.empty(0)), side_b.get(key, np.empty(0))
        seed = stats.stable_seed(boot.seed, "compare", *key)
        ci = stats.bootstrap_ratio(xb, xa, conf=boot.conf, n_resamples=boot.n_resamples, seed=seed)
        mw = stats.mann_whitney(xa, xb, alternative=alt)
        rows.append(
            {
                **dict(zip(CELL_KEYS, key, strict=True)),
                "n_a": int(xa.size),
                "n_b": int(xb.size),
                "median_a_s": _median(xa),
                "median_b_s": _median(xb),
                "ratio": finite_or_none(ci.estimate),
                "ratio_ci_low": finite_or_none(ci.low),
                "ratio_ci_high": finite_or_none(ci.high),
                "p_value": finite_or_none(mw.p_value),
                "prob_b_slower": finite_or_none(mw.prob_b_greater),
            }
        )
    return rows


def compare_runs(
    run_a: Run,
    run_b: Run,
    *,
    threshold: float = 0.05,
    alpha: float = 0.05,
    alternative: Literal["two-sided", "b-slower"] = "two-sided",
    force: bool = False,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
) -> Comparison:
    """Compare run B against baseline run A cell by cell; see the module docstring."""
    if threshold < 0 or not 0 < alpha < 1:
        raise ValueError("threshold must be >= 0 and alpha in (0, 1)")
    notes = _check_comparable(run_a, run_b, force)
    rows = _cells(run_a, run_b, alternative, boot)
    frame = frame_from_rows(rows, CELL_KEYS, run_a.requests, COMPARE_VALUES)
    adjusted = stats.holm(frame["p_value"].fill_null(math.nan).to_numpy())
    frame = (
        frame.with_columns(pl.Series("p_holm", adjusted).fill_nan(None))
        .with_columns(
            regression=(pl.col("ratio") > 1 + threshold) & (pl.col("p_holm") < alpha),
            improvement=(pl.col("ratio") < 1 - threshold) & (pl.col("p_holm") < alpha),
        )
        .with_columns(pl.col("regression", "improvement").fill_null(False))
    )
    verdict: Verdict = "no change"
    if frame["regression"].any():
        verdict = "regression"
    elif frame["improvement"].any():
        verdict = "improvement"
    return Comparison(frame.sort(list(CELL_KEYS)), verdict, threshold, alpha, notes)
