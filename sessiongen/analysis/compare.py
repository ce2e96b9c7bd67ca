"""Compare two runs of the same scenario: is run B slower than run A, faster, or the same?

Both runs replay the same sessions (same scenario, same seed), so a session is a unit
seen in both: for each cell (placement, cache, context size, turn), a session's TTFTs
in A (one per block of the arm) and in B are resampled together.

- ``ratio`` = median TTFT(B) / median TTFT(A), in modeled seconds, with a **paired
  (cluster) bootstrap** interval: sessions are drawn with replacement, each with all its
  blocks in both runs (Davison & Hinkley 1997, sec. 3.8), expanded for small session
  counts (Hesterberg 2015). Requests are not independent samples: pooling them as such
  made any 5% shift between two runs (clock, host, restart luck) "significant" with p
  near 1e-4. Where a cell's sessions cannot be paired (sessions missing from one run,
  rows without a session), each run's sessions are resampled on their own (unpaired)
  and the output says so.
- The decision reads the interval (:func:`sessiongen.analysis.stats.decide_ratio`):
  **slower** when the whole interval lies above ``1 + threshold``, **faster** when wholly
  below ``1 - threshold``, **no change** when it lies within ``1 +- threshold`` (an
  equivalence test), else **inconclusive**. The interval is ``1 - 2 alpha`` (90% for the
  default 5% tests): each one-sided decision and the equivalence (TOST, Schuirmann 1987)
  is a test at level ``alpha``.

The verdict is ``slower`` if any cell is slower, else ``inconclusive`` if any cell is,
else ``faster`` if any cell is, else ``no change``; cells present in only one run are
listed and left out. :data:`EXIT_CODES` maps it to the CLI's exit status: 0 for no
change or faster, 1 for slower, 3 for inconclusive (2 stays for usage errors).

Runs are refused (unless ``force=True``) when their ``scenario_digest`` differ (their
cells would not measure the same thing) or their time scales do (simulated runs: one
wall millisecond of lateness is ``1 / time_scale`` modeled milliseconds, so runs at
different scales carry different measurement error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import polars as pl
from numpy.typing import NDArray

from sessiongen.analysis import stats
from sessiongen.analysis.frames import (
    finite_or_none,
    frame_from_rows,
    partition,
    sample,
    session_units,
    unit_matrix,
)
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, MIN_SESSIONS, Bootstrap
from sessiongen.errors import RunDirError
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

Verdict = Literal["slower", "no change", "faster", "inconclusive"]
#: The CLI's exit status per verdict (2 is a usage error: bad flags, refused runs).
EXIT_CODES: dict[Verdict, int] = {"no change": 0, "faster": 0, "slower": 1, "inconclusive": 3}
#: Decisions of a cell: a :data:`Verdict`, or "missing" when one run lacks the cell.
MISSING = "missing"

COMPARE_VALUES: dict[str, pl.DataType] = {
    "n_a": pl.Int64(),
    "n_b": pl.Int64(),
    "sessions": pl.Int64(),
    "paired": pl.Boolean(),
    "median_a_s": pl.Float64(),
    "median_b_s": pl.Float64(),
    "ratio": pl.Float64(),
    "ratio_ci_low": pl.Float64(),
    "ratio_ci_high": pl.Float64(),
    "decision": pl.String(),
}


@dataclass(frozen=True)
class Comparison:
    """The per-cell comparison frame, the verdict, and notes on how the runs differ."""

    frame: pl.DataFrame
    verdict: Verdict
    threshold: float
    conf: float
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """The CLI's exit status: 0 no change or faster, 1 slower, 3 inconclusive."""
        return EXIT_CODES[self.verdict]

    def counts(self) -> dict[str, int]:
        """Cells per decision."""
        return {str(k): int(v) for k, v in self.frame.group_by("decision").len().iter_rows()}

    def summary(self) -> str:
        """One line: the verdict and how many cells went which way."""
        counts = self.counts()
        parts = [
            f"{counts[d]} {d}"
            for d in ("slower", "faster", "no change", "inconclusive", MISSING)
            if counts.get(d)
        ]
        return (
            f"{self.verdict.upper()}: {', '.join(parts) or 'no cells'} of {self.frame.height} "
            f"cells ({self.conf:.0%} paired-bootstrap intervals of B/A against "
            f"1 +- {self.threshold:.0%}); exit status {self.exit_code}"
        )

    def to_text(self) -> str:
        """The frame as a plain-text table (modeled seconds), then notes and the summary."""
        cols = ["median_a_s", "median_b_s", "ratio", "ratio_ci_low", "ratio_ci_high"]
        lines = [
            f"{'cell':<32} {'A (s)':>7} {'B (s)':>8} {'B/A':>6}  {'interval':<16} "
            f"{'sessions':>8}  decision"
        ]
        for row in self.frame.iter_rows(named=True):
            cell = f"{row['placement']}/{row['cache']}/{row['context_tokens']}/t{row['turn']}"
            a, b, ratio, low, high = (_fmt(row[c]) for c in cols)
            units = f"{row['sessions']}{'' if row['paired'] else ' unp.'}"
            decision = str(row["decision"])
            shown = decision.upper() if decision == "slower" else decision
            lines.append(
                f"{cell:<32} {a:>7} {b:>8} {ratio:>6}  {f'[{low}, {high}]':<16} {units:>8}  {shown}"
            )
        return "\n".join([*lines, *self.notes, self.summary()])


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.3f}"


def _check_comparable(run_a: Run, run_b: Run, force: bool) -> tuple[str, ...]:
    """Refuse different scenarios or time scales unless forced; note other differences."""
    refused = []
    da, db = run_a.meta.scenario_digest, run_b.meta.scenario_digest
    if da != db:
        refused.append(f"scenario_digest {db} differs from {run_a.path.name}'s {da}")
    sa, sb = run_a.time_scale, run_b.time_scale
    if not math.isclose(sa, sb, rel_tol=1e-9):
        refused.append(
            f"time scale {sb:g} differs from {run_a.path.name}'s {sa:g} (the measurement "
            "error in modeled seconds scales with 1 / time scale)"
        )
    if refused and not force:
        raise RunDirError(f"{run_b.path}: {'; '.join(refused)}; use --force to compare anyway")
    notes = [f"note: {what}; compared because forced" for what in refused]
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


def _ratio(
    sub_a: pl.DataFrame, sub_b: pl.DataFrame, boot: Bootstrap, seed: list[int]
) -> tuple[stats.Interval, bool]:
    """Median(B) / median(A): paired by session when both hold the same sessions."""
    units_a, units_b = session_units(sub_a), session_units(sub_b)
    opts = boot.options(seed)
    if units_a is not None and units_a == units_b:
        a, b = unit_matrix(sub_a, units_a), unit_matrix(sub_b, units_a)
        return stats.bootstrap_ratio(b, a, paired=True, **opts), True
    side_a = unit_matrix(sub_a, units_a) if units_a is not None else sample(sub_a)
    side_b = unit_matrix(sub_b, units_b) if units_b is not None else sample(sub_b)
    return stats.bootstrap_ratio(side_b, side_a, **opts), False


def _cells(run_a: Run, run_b: Run, boot: Bootstrap, threshold: float) -> list[dict[str, Any]]:
    """One comparison row per cell present in either run."""
    side_a = {tuple(k.values()): sub for k, sub in partition(run_a.ok, CELL_KEYS)}
    side_b = {tuple(k.values()): sub for k, sub in partition(run_b.ok, CELL_KEYS)}
    rows = []
    for key in sorted(set(side_a) | set(side_b), key=str):
        sub_a, sub_b = side_a.get(key), side_b.get(key)
        row: dict[str, Any] = dict(zip(CELL_KEYS, key, strict=True))
        xa = sample(sub_a) if sub_a is not None else np.empty(0)
        xb = sample(sub_b) if sub_b is not None else np.empty(0)
        row.update(n_a=int(xa.size), n_b=int(xb.size), median_a_s=_median(xa))
        row.update(median_b_s=_median(xb), decision=MISSING, paired=False, sessions=0)
        if sub_a is not None and sub_b is not None:
            seed = stats.stable_seed(boot.seed, "compare", *key)
            ci, paired = _ratio(sub_a, sub_b, boot, seed)
            row.update(
                ratio=finite_or_none(ci.estimate),
                ratio_ci_low=finite_or_none(ci.low),
                ratio_ci_high=finite_or_none(ci.high),
                decision=stats.decide_ratio(ci.low, ci.high, threshold),
                paired=paired,
                sessions=ci.n,
            )
        rows.append(row)
    return rows


def verdict_of(decisions: list[str]) -> Verdict:
    """Slower if any cell is, else inconclusive if any is (or none compared), else
    faster if any is, else no change."""
    compared = [d for d in decisions if d != MISSING]
    if "slower" in compared:
        return "slower"
    if "inconclusive" in compared or not compared:
        return "inconclusive"
    return "faster" if "faster" in compared else "no change"


def _result_notes(frame: pl.DataFrame) -> list[str]:
    """What the reader must know about pairing, missing cells and session counts."""
    notes = []
    compared = frame.filter(pl.col("decision") != MISSING)
    unpaired = compared.filter(~pl.col("paired")).height
    if unpaired:
        notes.append(
            f"note: {unpaired} of {compared.height} cells could not be paired by session (the "
            "runs hold different sessions there); their runs were resampled on their own"
        )
    missing = frame.height - compared.height
    if missing:
        notes.append(f"note: {missing} cells are in one run only; left out of the verdict")
    few = compared.filter(pl.col("sessions") < MIN_SESSIONS)
    if few.height:
        fewest = int(few["sessions"].to_numpy().min())
        notes.append(
            f"warning: {few.height} cells rest on fewer than {MIN_SESSIONS} sessions (as few "
            f"as {fewest}); their intervals cover less than stated (README, Analysis), so "
            "decisions there are less certain"
        )
    return notes


def compare_runs(
    run_a: Run,
    run_b: Run,
    *,
    threshold: float = 0.05,
    alpha: float = 0.05,
    force: bool = False,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
) -> Comparison:
    """Compare run B against baseline run A cell by cell; see the module docstring.

    ``alpha`` is the level of each test: intervals are ``1 - 2 alpha`` (``boot.conf`` is
    replaced). A :class:`RunDirError` when the runs are not comparable and not forced.
    """
    if not threshold >= 0 or not 0 < alpha < 0.5:
        raise ValueError("threshold must be >= 0 and alpha in (0, 0.5)")
    notes = _check_comparable(run_a, run_b, force)
    boot = replace(boot, conf=1.0 - 2.0 * alpha)
    rows = _cells(run_a, run_b, boot, threshold)
    frame = frame_from_rows(rows, CELL_KEYS, run_a.requests, COMPARE_VALUES).sort(list(CELL_KEYS))
    verdict = verdict_of(frame["decision"].to_list())
    return Comparison(frame, verdict, threshold, boot.conf, (*notes, *_result_notes(frame)))
