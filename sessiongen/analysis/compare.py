"""Compare runs of the same scenario: is side B slower than baseline side A, faster, the same?

Each side is one run or several runs of the same scenario (same sessions, same seed). A
*cell* is (placement, cache, context size, turn). Its statistic is the median TTFT in
modeled seconds, failed requests included as slower than any finished one (a run that
times out on its slowest requests must not look faster: :data:`~.stats.FAILED`).

**The ratio B/A and its interval.** Per run, the log median of the cell; per side, the
mean over its runs; ``log(B/A)`` is the difference. Its standard error has two parts:

- *sampling*, from a **paired (cluster) bootstrap over sessions**: sessions are drawn
  with replacement, each with all its blocks in every run of both sides, so that the
  spread between sessions (common to both sides) cancels (Davison & Hinkley 1997, sec.
  3.8); the robust SD of the draws times ``sqrt(n / (n - 1))`` (:func:`~.stats.robust_sd`),
  on ``n - 1`` degrees of freedom for ``n`` sessions. Where a cell's sessions cannot be
  paired (the runs hold different sessions there, or rows without a session), each run
  is resampled on its own and the output says so.
- *run to run*: every run carries a noise no interval of one run can see (host, clock,
  restart and placement luck: 3-5% per cell on real replicas, the trend store measures
  it night after night), with SD ``tau`` on the log median of a cell. It adds
  ``tau^2 (1/k_A + 1/k_B)`` for ``k`` runs a side. :class:`RunNoise` says where ``tau``
  came from, in this order: given (``--run-noise``, e.g. from A/A runs), estimated from
  the spread between the runs of a side when a side has several
  (:func:`~.hypotheses.replicate_noise`, pooled over cells), the trend store's pooled night
  noise for the scenario (``--store``), else :data:`DEFAULT_RUN_NOISE` (4%, assumed).

The two add on the log scale, with Welch-Satterthwaite degrees of freedom, and the
ratio's interval and tests use Student's t (:class:`~.hypotheses.LogTest`).

**Failures** count against a run twice: inside the median (above), and in a per-cell
test of the failure share with **sessions as units**: per session, the share of its
requests in the cell that failed, B minus A. "B fails more" is an exact sign test over
sessions (paired) or a one-sided Mann-Whitney test (unpaired); a cell is not "no change"
or "faster" unless B's failure share is surely within ``failure_margin`` of A's (a
one-sided t bound over sessions) or no session failed more in B.

**Decisions** per cell, each test at level ``alpha`` (the intervals are ``1 - 2 alpha``):

- **slower**: B/A surely above ``1 + threshold``, or B surely fails more, after a
  **Holm** step-down correction over every cell's "slower" tests (Holm 1979): with 24
  cells a run is not called slower because one cell in twenty wobbled;
- **faster**: B/A surely below ``1 - threshold`` (Holm over cells) and failures no worse;
- **no change**: B/A within ``1 +- threshold`` by two one-sided tests (TOST, Schuirmann
  1987; over many cells an intersection-union test, valid without adjustment: Berger
  1982) and failures no worse;
- **inconclusive** otherwise, and always below :data:`~.stats.MIN_SESSIONS` sessions
  (there the interval cannot cover as stated: "not enough data" is the answer).

The verdict is ``slower`` if any cell is, else ``inconclusive`` if any is, else
``faster`` if any is, else ``no change``; cells present in only one side are listed and
left out. :data:`EXIT_CODES` maps it to the CLI's exit status: 0 for no change or faster,
1 for slower, 3 for inconclusive (2 stays for usage errors). bench/compare_aa.py measures
how often identical runs are called slower and how often real slowdowns are found.

Runs are refused (unless ``force=True``) when their ``scenario_digest`` differ or their
time scales do (a simulated run's measurement error in modeled seconds scales with
``1 / time scale``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from sessiongen.analysis import stats
from sessiongen.analysis.comparecells import resampled, with_failures
from sessiongen.analysis.comparetests import cell_rows
from sessiongen.analysis.frames import frame_from_rows, partition
from sessiongen.analysis.runnoise import (
    DEFAULT_RUN_NOISE,
    NOISE_LEVEL,
    REPLICATE_UPPER,
    CellNoise,
    RunNoise,
    noise_notes,
    resolve_run_noise,
)
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, MIN_SESSIONS, Bootstrap
from sessiongen.errors import RunDirError
from sessiongen.infra.lazy import lazy_module
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

if TYPE_CHECKING:
    from scipy import stats as sps
else:
    sps = lazy_module("scipy.stats")

# The comparison's front: the noise's names in use (docs' figures, tests) are taken from here
# too; they live in :mod:`.runnoise`.
__all__ = [
    "DEFAULT_RUN_NOISE",
    "EXIT_CODES",
    "MISSING",
    "NOISE_LEVEL",
    "REPLICATE_UPPER",
    "CellNoise",
    "Comparison",
    "RunNoise",
    "Verdict",
    "compare_runs",
    "verdict_of",
]

Verdict = Literal["slower", "no change", "faster", "inconclusive"]
#: The CLI's exit status per verdict (2 is a usage error: bad flags, refused runs).
EXIT_CODES: dict[Verdict, int] = {"no change": 0, "faster": 0, "slower": 1, "inconclusive": 3}
#: Decisions of a cell: a :data:`Verdict`, or "missing" when one side lacks the cell.
MISSING = "missing"


COMPARE_VALUES: dict[str, pl.DataType] = {
    "n_a": pl.Int64(),
    "n_b": pl.Int64(),
    "failed_a": pl.Int64(),
    "failed_b": pl.Int64(),
    "sessions": pl.Int64(),
    "paired": pl.Boolean(),
    "median_a_s": pl.Float64(),
    "median_b_s": pl.Float64(),
    "ratio": pl.Float64(),
    "ratio_ci_low": pl.Float64(),
    "ratio_ci_high": pl.Float64(),
    "p_slower": pl.Float64(),
    "decision": pl.String(),
    "why": pl.String(),
}


@dataclass(frozen=True)
class Comparison:
    """The per-cell comparison frame, the verdict, and notes on how the runs differ."""

    frame: pl.DataFrame
    verdict: Verdict
    threshold: float
    conf: float
    run_noise: RunNoise = DEFAULT_RUN_NOISE
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """The CLI's exit status: 0 no change or faster, 1 slower, 3 inconclusive."""
        return EXIT_CODES[self.verdict]

    def counts(self) -> dict[str, int]:
        """Cells per decision."""
        return {str(k): int(v) for k, v in self.frame.group_by("decision").len().iter_rows()}

    def summary(self) -> str:
        """One line: the verdict, how many cells went which way, and how sure that is."""
        counts = self.counts()
        parts = [
            f"{counts[d]} {d}"
            for d in ("slower", "faster", "no change", "inconclusive", MISSING)
            if counts.get(d)
        ]
        return (
            f"{self.verdict.upper()}: {', '.join(parts) or 'no cells'} of {self.frame.height} "
            f"cells ({self.conf:.0%} intervals of B/A over sessions plus "
            f"{self.run_noise.sd:.1%} run-to-run noise, against 1 +- {self.threshold:.0%}; "
            f"Holm-corrected over cells); exit status {self.exit_code}"
        )

    def to_text(self) -> str:
        """The frame as a plain-text table (modeled seconds), then notes and the summary."""
        lines = [
            f"{'cell':<32} {'A (s)':>7} {'B (s)':>8} {'B/A':>6}  {'interval':<16} "
            f"{'sessions':>8} {'failed A/B':>10}  decision"
        ]
        for row in self.frame.iter_rows(named=True):
            cell = f"{row['placement']}/{row['cache']}/{row['context_tokens']}/t{row['turn']}"
            a, b, ratio = (_fmt(row[c]) for c in ("median_a_s", "median_b_s", "ratio"))
            if "failed" in (a, b):
                ratio = "-"  # a ratio against a failed median is not a number to read
            low, high = _fmt(row["ratio_ci_low"]), _fmt(row["ratio_ci_high"])
            units = f"{row['sessions']}{'' if row['paired'] else ' unp.'}"
            failed = f"{row['failed_a']}/{row['failed_b']}"
            decision = str(row["decision"])
            shown = decision.upper() if decision == "slower" else decision
            if row["why"]:
                shown += f" ({row['why']})"
            lines.append(
                f"{cell:<32} {a:>7} {b:>8} {ratio:>6}  {f'[{low}, {high}]':<16} {units:>8} "
                f"{failed:>10}  {shown}"
            )
        return "\n".join([*lines, f"note: {self.run_noise.text()}", *self.notes, self.summary()])


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value >= stats.FAILED_FROM:
        return "failed"
    return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.3f}"


def _check_comparable(runs: Sequence[Run], force: bool) -> tuple[str, ...]:
    """Refuse different scenarios or time scales unless forced; note other differences."""
    base = runs[0]
    refused = []
    for other in runs[1:]:
        da, db = base.meta.scenario_digest, other.meta.scenario_digest
        if da != db:
            refused.append(
                f"{other.path}: scenario_digest {db} differs from {base.path.name}'s {da}"
            )
        sa, sb = base.time_scale, other.time_scale
        if not math.isclose(sa, sb, rel_tol=1e-9):
            refused.append(
                f"{other.path}: time scale {sb:g} differs from {base.path.name}'s {sa:g} (the "
                "measurement error in modeled seconds scales with 1 / time scale)"
            )
    if refused and not force:
        raise RunDirError(f"{'; '.join(refused)}; use --force to compare anyway")
    notes = [f"note: {what}; compared because forced" for what in refused]
    for label, attr in (("target", "target_label"), ("sessiongen version", "version")):
        values = {_identity(r, attr) for r in runs}
        if len(values) > 1:
            notes.append(f"note: {label} differs between the runs: {', '.join(sorted(values))}")
    notes += [f"note: run {r.run_id} is incomplete" for r in runs if r.meta.complete is False]
    return tuple(notes)


def _identity(run: Run, attr: str) -> str:
    return str(run.target_label if attr == "target_label" else run.meta.sessiongen_version)


def verdict_of(decisions: list[str]) -> Verdict:
    """Slower if any cell is, else inconclusive if any is (or none compared), else
    faster if any is, else no change."""
    compared = [d for d in decisions if d != MISSING]
    if "slower" in compared:
        return "slower"
    if "inconclusive" in compared or not compared:
        return "inconclusive"
    return "faster" if "faster" in compared else "no change"


def _result_notes(
    frame: pl.DataFrame, noise: RunNoise, threshold: float, conf: float, runs_a: int, runs_b: int
) -> list[str]:
    """What the reader must know about pairing, missing cells, session counts, noise."""
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
        notes.append(f"note: {missing} cells are in one side only; left out of the verdict")
    few = compared.filter(pl.col("sessions") < MIN_SESSIONS)
    if few.height:
        fewest = int(few["sessions"].to_numpy().min())
        notes.append(
            f"warning: {few.height} cells rest on fewer than {MIN_SESSIONS} sessions (as few "
            f"as {fewest}): not enough data for a decision there, so they are inconclusive"
        )
    notes += noise_notes(noise, threshold, conf, runs_a, runs_b)
    half = float(sps.norm.ppf(0.5 + conf / 2)) * noise.sd * math.sqrt(1 / runs_a + 1 / runs_b)
    if compared.height and math.expm1(half) > threshold:
        notes.append(
            f"note: with {runs_a} and {runs_b} runs a side, the {noise.sd:.1%} run-to-run "
            f"noise alone makes a {conf:.0%} interval about +-{math.expm1(half):.0%} wide, so "
            f"'no change' within +-{threshold:.0%} cannot be shown; more runs a side narrow it"
        )
    return notes


def compare_runs(
    run_a: Run | Sequence[Run],
    run_b: Run | Sequence[Run],
    *,
    threshold: float = 0.05,
    alpha: float = 0.05,
    failure_margin: float = 0.02,
    force: bool = False,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
    run_noise: RunNoise | None = None,
) -> Comparison:
    """Compare side B (one run or several) against baseline side A cell by cell.

    See the module docstring. ``alpha`` is the level of each test (intervals are
    ``1 - 2 alpha``); ``failure_margin`` the largest rise in the share of failed requests
    that still counts as the same; ``run_noise`` the run-to-run noise (None: estimated
    from replicate runs when a side has several, else :data:`DEFAULT_RUN_NOISE`). A
    :class:`RunDirError` when the runs are not comparable and not forced.
    """
    if not threshold >= 0 or not 0 < alpha < 0.5 or not 0 <= failure_margin < 1:
        raise ValueError("threshold must be >= 0, alpha in (0, 0.5), failure_margin in [0, 1)")
    side_a = (run_a,) if isinstance(run_a, Run) else tuple(run_a)
    side_b = (run_b,) if isinstance(run_b, Run) else tuple(run_b)
    if not side_a or not side_b:
        raise ValueError("each side needs at least one run")
    notes = _check_comparable((*side_a, *side_b), force)
    parts = [
        {tuple(k.values()): sub for k, sub in partition(with_failures(r), CELL_KEYS)}
        for r in (*side_a, *side_b)
    ]
    keys = sorted(set().union(*parts), key=str)
    k = len(side_a)
    cells, rows = [], []
    for key in keys:
        named = dict(zip(CELL_KEYS, key, strict=True))
        subs = [p.get(key) for p in parts]
        present = [s for s in subs if s is not None]
        if len(present) < len(subs):
            rows.append(_missing_row(named, subs[:k], subs[k:]))
            continue
        cells.append(resampled(named, tuple(present[:k]), tuple(present[k:]), boot))
    noise = resolve_run_noise(cells, run_noise, (len(side_a), len(side_b)))
    rows += cell_rows(cells, noise, threshold, alpha, failure_margin)
    frame = frame_from_rows(rows, CELL_KEYS, side_a[0].requests, COMPARE_VALUES)
    frame = frame.sort(list(CELL_KEYS))
    verdict = verdict_of(frame["decision"].to_list())
    conf = 1.0 - 2.0 * alpha
    extra = _result_notes(frame, noise, threshold, conf, len(side_a), len(side_b))
    notes = (*notes, *_arms_note(side_a, side_b), *extra)
    return Comparison(frame, verdict, threshold, conf, noise, notes)


def _arms_note(side_a: Sequence[Run], side_b: Sequence[Run]) -> tuple[str, ...]:
    """Single-arm runs of different arms (an OFF run against an ON run): compare pairs
    cells of the same arm, so nothing matches; say how to measure the cache instead."""
    arms = [
        {c for r in side for c in r.requests["cache"].unique().to_list()}
        for side in (side_a, side_b)
    ]
    if not arms[0] or not arms[1] or not arms[0].isdisjoint(arms[1]):
        return ()
    a, b = (", ".join(sorted(x)) for x in arms)
    return (
        f"note: RUN_A holds only cache {a} and RUN_B only cache {b}; compare matches cells of "
        "the same arm, so none match: for the cache's effect, merge them into one run "
        "(sessiongen report RUN_A RUN_B)",
    )


def _missing_row(
    key: dict[str, object],
    subs_a: Sequence[pl.DataFrame | None],
    subs_b: Sequence[pl.DataFrame | None],
) -> dict[str, object]:
    def n(subs: Sequence[pl.DataFrame | None]) -> int:
        return sum(s.height for s in subs if s is not None)

    return {
        **key,
        "n_a": n(subs_a),
        "n_b": n(subs_b),
        "failed_a": 0,
        "failed_b": 0,
        "sessions": 0,
        "paired": False,
        "decision": MISSING,
        "why": "",
    }
