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
  (:func:`~.stats.replicate_noise`, pooled over cells), the trend store's pooled night
  noise for the scenario (``--store``), else :data:`DEFAULT_RUN_NOISE` (4%, assumed).

The two add on the log scale, with Welch-Satterthwaite degrees of freedom, and the
ratio's interval and tests use Student's t (:class:`~.stats.LogTest`).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl
from scipy import stats as sps

from sessiongen.analysis import stats
from sessiongen.analysis.frames import frame_from_rows, partition, unit_matrix
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, MIN_SESSIONS, Bootstrap
from sessiongen.errors import RunDirError
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

Verdict = Literal["slower", "no change", "faster", "inconclusive"]
#: The CLI's exit status per verdict (2 is a usage error: bad flags, refused runs).
EXIT_CODES: dict[Verdict, int] = {"no change": 0, "faster": 0, "slower": 1, "inconclusive": 3}
#: Decisions of a cell: a :data:`Verdict`, or "missing" when one side lacks the cell.
MISSING = "missing"


@dataclass(frozen=True)
class RunNoise:
    """Run-to-run SD ``sd`` of a cell's log median, where it came from, and its df.

    ``cells``: per-cell estimates where the runs (or a trend store) can tell them apart,
    keyed by the cell's :data:`~sessiongen.records.format.CELL_KEYS` values, each a
    :class:`CellNoise`; a cell absent here has ``sd``.
    """

    sd: float
    source: str
    df: float = math.inf
    cells: Mapping[tuple[Any, ...], CellNoise] = field(default_factory=dict)

    def text(self) -> str:
        df = "" if math.isinf(self.df) else f", {self.df:g} df"
        return f"run-to-run noise {self.sd:.1%} per run ({self.source}{df})"

    def of(self, key: tuple[Any, ...]) -> tuple[float, float]:
        """The SD and df to use for one cell: its own estimate's upper bound where it is
        surely above :data:`NOISE_LEVEL` (:class:`CellNoise`) and above the pooled
        ``sd``, else the pooled."""
        own = self.cells.get(key)
        if own is not None and own.loud and own.upper > self.sd:
            return own.upper, own.df
        return self.sd, self.df


@dataclass(frozen=True)
class CellNoise:
    """One cell's own run-to-run SD: the point estimate, its upper bound, its df, and
    whether it is surely above :data:`NOISE_LEVEL` (:func:`cell_noise`)."""

    sd: float
    upper: float
    df: float
    loud: bool = False


#: Used when nothing better is known: the upper half of the 3-5% night-to-night noise per
#: cell that the trend store measured on real replicas (docs/guides/nightly.md).
DEFAULT_RUN_NOISE = RunNoise(
    0.04, "assumed: give --run-noise from A/A runs, several runs a side, or --store"
)
#: The per-cell run-to-run noise (SD of a cell's log median) up to which one run a side
#: with the assumed :data:`DEFAULT_RUN_NOISE` keeps the false-alarm rate (identical runs
#: called slower) at 5%. `.venv/bin/python bench/compare_aa.py --sweep` (100 seeded A/A
#: pairs per level, 8 sessions, one run a side) measured, smoke-like / alt32k-like:
#: false alarms 0% / 1% / 5% / 12% / 29% and 0% / 1% / 6% / 15% / 34% at 4 / 5 / 6 / 7 / 8%
#: noise. A cell whose own noise (from several runs a side) is surely above it is named
#: in the output and widened by that noise.
NOISE_LEVEL = 0.06

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


def _with_failures(run: Run) -> pl.DataFrame:
    """The run's requests with ``_ttft``: TTFT, +inf for a failed request."""
    failed = pl.col("status") != "ok"
    ttft = pl.when(failed).then(float("inf")).otherwise(pl.col("ttft_s"))
    return run.requests.with_columns(_ttft=ttft, _failed=failed.cast(pl.Float64))


@dataclass(frozen=True)
class _CellData:
    """One cell's requests in every run of both sides, resampled once."""

    key: dict[str, object]
    subs_a: tuple[pl.DataFrame, ...]
    subs_b: tuple[pl.DataFrame, ...]
    units: list[Any] | None  # the sessions, when every run holds the same ones
    point: np.ndarray[Any, np.dtype[np.float64]]  # log median per run (A runs, then B)
    draws: np.ndarray[Any, np.dtype[np.float64]]  # bootstrap draws x runs

    @property
    def n_units(self) -> int:
        if self.units is not None:
            return len(self.units)
        return min(int(s["session_index"].n_unique()) for s in (*self.subs_a, *self.subs_b))

    def split(self, values: np.ndarray[Any, np.dtype[np.float64]]) -> tuple[Any, Any]:
        k = len(self.subs_a)
        return values[..., :k], values[..., k:]


def _units(subs: Sequence[pl.DataFrame]) -> list[Any] | None:
    sets = []
    for sub in subs:
        if sub.is_empty() or sub["session_index"].null_count():
            return None
        sets.append(sorted(sub["session_index"].unique().to_list()))
    return sets[0] if all(s == sets[0] for s in sets) else None


def _resampled(
    key: dict[str, object],
    a: tuple[pl.DataFrame, ...],
    b: tuple[pl.DataFrame, ...],
    boot: Bootstrap,
) -> _CellData:
    subs = (*a, *b)
    units = _units(subs)
    if units is not None:
        mats = [unit_matrix(s, units, "_ttft") for s in subs]
    else:
        mats = [_matrix_of_own(s) for s in subs]
    point, draws = stats.log_quantile_draws(
        mats,
        0.5,
        paired=units is not None,
        n_resamples=boot.n_resamples,
        seed=stats.stable_seed(boot.seed, "compare", *key.values()),
    )
    return _CellData(key, a, b, units, point, draws)


def _matrix_of_own(sub: pl.DataFrame) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A run's own sessions as units, or its requests when some row has no session."""
    if sub.is_empty() or sub["session_index"].null_count():
        return sub["_ttft"].drop_nulls().to_numpy().astype(np.float64)
    return unit_matrix(sub, sorted(sub["session_index"].unique().to_list()), "_ttft")


def _replicate_groups(cells: Sequence[_CellData]) -> list[tuple[Any, Any]]:
    """Per cell and side with several runs: the runs' log medians and the sampling
    variance of each one's deviation from their mean (robust, corrected for the session
    count, as the latency test's). Cells where a resampled median landed on failed
    requests are left out: their log draws jump to log(FAILED) and would swamp the rest."""
    return [group for cell in cells for group in _cell_groups(cell)]


def _cell_groups(cell: _CellData) -> list[tuple[Any, Any]]:
    """One cell's replicate groups (:func:`_replicate_groups`): one per side with several runs."""
    groups = []
    failed = math.log(stats.FAILED_FROM)
    factor = stats.small_sample_factor(cell.n_units) ** 2
    for point, draws in zip(cell.split(cell.point), cell.split(cell.draws), strict=True):
        if point.size < 2 or np.nanmax(draws) >= failed:
            continue
        deviation = draws - np.nanmean(draws, axis=1, keepdims=True)
        variance = [stats.robust_sd(deviation[:, r]) ** 2 * factor for r in range(point.size)]
        groups.append((point, np.asarray(variance)))
    return groups


def _upper(tau: float, df: float) -> float:
    """``tau`` at its :data:`REPLICATE_UPPER` bound on ``df`` degrees of freedom."""
    return tau * math.sqrt(df / float(sps.chi2.ppf(1.0 - REPLICATE_UPPER, df)))


def cell_noise(cells: Sequence[_CellData]) -> dict[tuple[Any, ...], CellNoise]:
    """Each cell's own run-to-run SD from its replicate runs (both sides pooled).

    The method of moments of :func:`~.stats.replicate_noise` on the cell alone: the
    spread of its runs' log medians around their side's mean, less what the sessions'
    sampling alone would give, on ``sum (k - 1)`` df (4 with three runs a side), with
    its :data:`REPLICATE_UPPER` bound. A cell none of whose sides has two runs is absent.

    On 4 df one cell in a hundred reads twice its true noise, so a cell is *loud* only
    when the chi-square test of ``tau <= NOISE_LEVEL`` (``df tau^2 / level^2`` against
    ``chi2_df``) rejects at 5% Bonferroni-corrected over the cells: at a true 3% a
    point estimate above 6% came up in one of 3 seeded 12-cell comparisons.
    """
    estimates = {}
    for cell in cells:
        tau, df = stats.replicate_noise(_cell_groups(cell))
        if df > 0 and math.isfinite(tau):
            estimates[tuple(cell.key.values())] = (tau, float(df))
    alpha = 0.05 / max(1, len(estimates))
    return {
        key: CellNoise(
            tau,
            _upper(tau, df),
            df,
            float(sps.chi2.sf(df * tau**2 / NOISE_LEVEL**2, df)) < alpha,
        )
        for key, (tau, df) in estimates.items()
    }


#: The replicate estimate is taken at this upper confidence bound (as the trend's night
#: noise is): with a handful of runs a side it is often too small, and a noise taken too
#: small turns run-to-run wobbles into verdicts.
REPLICATE_UPPER = 0.6


def resolve_run_noise(
    cells: Sequence[_CellData], given: RunNoise | None, runs: tuple[int, int]
) -> RunNoise:
    """The run-to-run noise to use (module docstring: given, replicates, store, default).

    From replicates the variance is pooled over cells, but its degrees of freedom are
    those of the runs, ``sum (k - 1)`` over the sides: a run's noise is largely common to
    all its cells (the host was slow that day), so the cells are not independent
    evidence of it. The estimate is then taken at its :data:`REPLICATE_UPPER` bound.
    Each cell's own estimate (:func:`cell_noise`) rides along: a cell noisier than
    :data:`NOISE_LEVEL` and than the pooled figure is widened by its own (:meth:`RunNoise.of`).
    """
    if given is not None:
        return given
    tau, cell_df = stats.replicate_noise(_replicate_groups(cells))
    df = sum(k - 1 for k in runs)
    if cell_df > 0 and df > 0 and math.isfinite(tau):
        source = (
            f"estimated from the spread between the runs of a side, at its "
            f"{REPLICATE_UPPER:.0%} upper bound (point {tau:.1%})"
        )
        return RunNoise(_upper(tau, df), source, float(df), cell_noise(cells))
    return DEFAULT_RUN_NOISE


def _latency_test(cell: _CellData, noise: RunNoise) -> stats.LogTest:
    point_a, point_b = cell.split(cell.point)
    draws_a, draws_b = cell.split(cell.draws)
    estimate = float(np.mean(point_b) - np.mean(point_a))
    diff = np.nanmean(draws_b, axis=1) - np.nanmean(draws_a, axis=1)
    n = cell.n_units
    sampling = stats.robust_sd(diff) * stats.small_sample_factor(n)
    sd, df = noise.of(tuple(cell.key.values()))
    run_var = sd**2 * (1 / point_a.size + 1 / point_b.size)
    parts = [(sampling**2, float(n - 1)), (run_var, df)]
    se = math.sqrt(sampling**2 + run_var) if math.isfinite(sampling) else math.nan
    return stats.LogTest(estimate, se, stats.welch_df(parts))


def _session_failure_shares(subs: Sequence[pl.DataFrame], units: list[Any]) -> Any:
    """Per session: the share of its requests in the cell that failed, over the runs."""
    frame = pl.concat([s.select("session_index", "_failed") for s in subs])
    shares = frame.group_by("session_index").agg(pl.col("_failed").mean())
    lookup = dict(zip(shares["session_index"].to_list(), shares["_failed"].to_list(), strict=True))
    return np.array([lookup.get(u, np.nan) for u in units], dtype=np.float64)


@dataclass(frozen=True)
class _FailureTest:
    p_worse: float  # B fails more (sessions as units)
    no_worse: bool  # B's failure share surely within the margin of A's


def _failure_test(cell: _CellData, margin: float, alpha: float) -> _FailureTest:
    failed_a = sum(float(s["_failed"].sum()) for s in cell.subs_a)
    failed_b = sum(float(s["_failed"].sum()) for s in cell.subs_b)
    if failed_b == 0 and failed_a == 0:
        return _FailureTest(1.0, True)
    if cell.units is not None:
        diff = _session_failure_shares(cell.subs_b, cell.units) - _session_failure_shares(
            cell.subs_a, cell.units
        )
        p = stats.sign_test_greater(diff)
        bound = stats.upper_mean_bound(diff, conf=1 - alpha)
        return _FailureTest(p, bool(np.nanmax(diff) <= 0 or bound <= margin))
    shares_a, shares_b = _own_failure_shares(cell.subs_a), _own_failure_shares(cell.subs_b)
    p = stats.mann_whitney(shares_a, shares_b, alternative="b-greater").p_value
    no_worse = bool(np.mean(shares_b) <= np.mean(shares_a))
    upper = stats.upper_difference_bound(shares_b, shares_a, conf=1 - alpha)
    return _FailureTest(1.0 if math.isnan(p) else p, no_worse or upper <= margin)


def _own_failure_shares(subs: Sequence[pl.DataFrame]) -> Any:
    frame = pl.concat([s.select("session_index", "_failed") for s in subs])
    if frame["session_index"].null_count():
        return frame["_failed"].to_numpy().astype(np.float64)
    return frame.group_by("session_index").agg(pl.col("_failed").mean())["_failed"].to_numpy()


def _median_s(subs: Sequence[pl.DataFrame]) -> float | None:
    values = np.concatenate([s["_ttft"].drop_nulls().to_numpy() for s in subs])
    if values.size == 0:
        return None
    return float(np.median(np.where(np.isposinf(values), stats.FAILED, values)))


def _decide(
    test: stats.LogTest,
    fails: _FailureTest,
    holm_slower: float,
    holm_faster: float,
    threshold: float,
    alpha: float,
) -> tuple[str, str]:
    """A cell's decision and why (see the module docstring)."""
    if holm_slower < alpha:
        slow_latency = test.p_above(1 + threshold) <= fails.p_worse
        return "slower", "latency" if slow_latency else "fails more"
    if not fails.no_worse:
        return "inconclusive", "more failures in B"
    if holm_faster < alpha:
        return "faster", ""
    equivalent = max(test.p_below(1 + threshold), test.p_above(1 - threshold)) < alpha
    return ("no change", "") if equivalent else ("inconclusive", "")


def run_failure_p(cells: Sequence[_CellData]) -> float:
    """One-sided p of "B fails more" over the whole run, sessions as units.

    Per session, the share of its requests that failed in all the cells (B minus A, over
    the sessions both sides hold): a one-sided Student t test on those differences
    (:func:`~.stats.mean_exceeds`). A per-cell sign test cannot fire at the shipped
    session counts once Holm-corrected (its smallest p is 2^-n: 0.004 at 8 sessions,
    against 0.05 / 25), nor could a run-wide one; the t test on a run-wide share can,
    and it is one more member of the family.
    """
    if not cells:
        return 1.0
    sides = [
        pl.concat([s.select("session_index", "_failed") for c in cells for s in c.subs_a]),
        pl.concat([s.select("session_index", "_failed") for c in cells for s in c.subs_b]),
    ]
    if any(side["session_index"].null_count() for side in sides):
        return 1.0
    shares = [side.group_by("session_index").agg(pl.col("_failed").mean()) for side in sides]
    both = shares[0].join(shares[1], on="session_index", suffix="_b")
    return stats.mean_exceeds((both["_failed_b"] - both["_failed"]).to_numpy())


def _cell_rows(
    cells: Sequence[_CellData], noise: RunNoise, threshold: float, alpha: float, margin: float
) -> list[dict[str, object]]:
    """One decided row per cell held by both sides; Holm over the cells that can decide,
    with the run-wide failure test as one more member of the "slower" family."""
    tests = [_latency_test(c, noise) for c in cells]
    fails = [_failure_test(c, margin, alpha) for c in cells]
    able = np.array([c.n_units >= MIN_SESSIONS for c in cells])
    slower = np.array(
        [[t.p_above(1 + threshold), f.p_worse] for t, f in zip(tests, fails, strict=True)]
    ).reshape(-1, 2)
    faster = np.array([t.p_below(1 - threshold) for t in tests])
    family = np.append(np.where(able[:, None], slower, np.nan).ravel(), run_failure_p(cells))
    adjusted = stats.holm(family)
    slower_adj, run_fails = adjusted[:-1].reshape(-1, 2), bool(adjusted[-1] < alpha)
    faster_adj = stats.holm(np.where(able, faster, np.nan))
    conf = 1 - 2 * alpha
    rows = []
    for i, (cell, test, fail) in enumerate(zip(cells, tests, fails, strict=True)):
        p_slow = float(np.nanmin(slower_adj[i])) if able[i] else math.nan
        if able[i]:
            decision, why = _decide(test, fail, p_slow, float(faster_adj[i]), threshold, alpha)
            if run_fails and decision != "slower" and _fails_more(cell):
                decision, why = "slower", "fails more (over the whole run)"
        else:
            decision, why = "inconclusive", f"fewer than {MIN_SESSIONS} sessions"
        low, high = test.interval(conf)
        rows.append(
            {
                **_sizes(cell),
                "sessions": cell.n_units,
                "paired": cell.units is not None,
                "ratio": math.exp(test.estimate) if math.isfinite(test.estimate) else None,
                "ratio_ci_low": low if math.isfinite(low) else None,
                "ratio_ci_high": high if math.isfinite(high) else None,
                "p_slower": p_slow if math.isfinite(p_slow) else None,
                "decision": decision,
                "why": why,
            }
        )
    return rows


def _fails_more(cell: _CellData) -> bool:
    """B's share of failed requests in the cell is above A's."""

    def share(subs: Sequence[pl.DataFrame]) -> float:
        total = sum(s.height for s in subs)
        return sum(float(s["_failed"].sum()) for s in subs) / total if total else 0.0

    return share(cell.subs_b) > share(cell.subs_a)


def _sizes(cell: _CellData) -> dict[str, object]:
    def count(subs: Sequence[pl.DataFrame], failed: bool) -> int:
        return int(sum((s["_failed"].sum() if failed else s.height) for s in subs))

    return {
        **cell.key,
        "n_a": count(cell.subs_a, False),
        "n_b": count(cell.subs_b, False),
        "failed_a": count(cell.subs_a, True),
        "failed_b": count(cell.subs_b, True),
        "median_a_s": _median_s(cell.subs_a),
        "median_b_s": _median_s(cell.subs_b),
    }


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


def _cell_name(key: tuple[Any, ...]) -> str:
    placement, cache, context, turn = key
    return f"{placement}/{cache}/{context}/t{turn}"


def noise_notes(
    noise: RunNoise, threshold: float, conf: float, runs_a: int, runs_b: int
) -> list[str]:
    """Which noise regime the runs are in, against :data:`NOISE_LEVEL`.

    With the assumed noise (one run a side, nothing measured), a reminder of how far it
    holds. With a measured noise, one warning line naming the cells surely above the
    level (:func:`cell_noise`), or the whole run when the pooled noise is: their noise,
    that their intervals carry it, and how many runs a side would make "no change"
    within the threshold reachable at that noise:
    ``k >= 2 (z tau / log(1 + threshold))^2`` (run noise alone within the margin).
    """
    if noise is DEFAULT_RUN_NOISE:
        return [
            f"note: one run a side cannot measure its run-to-run noise; the assumed "
            f"{noise.sd:.0%} keeps false alarms at 5% while the true noise is at most "
            f"{NOISE_LEVEL:.0%} per cell (bench/compare_aa.py; at 8% they reach about 30%, "
            "and real replicas can move 13% from run to run)"
        ]
    loud = sorted(((key, c) for key, c in noise.cells.items() if c.loud), key=lambda kc: -kc[1].sd)
    pooled = noise.sd > NOISE_LEVEL
    if not loud and not pooled:
        return []
    worst = max([noise.sd, *(c.upper for _, c in loud)])
    z = float(sps.norm.ppf(0.5 + conf / 2))
    margin = math.log1p(threshold) if threshold > 0 else math.nan
    need = math.ceil(2 * (z * worst / margin) ** 2) if math.isfinite(margin) else None
    if loud:
        shown = ", ".join(f"{_cell_name(key)} {c.sd:.1%}" for key, c in loud[:6])
        more = f" and {len(loud) - 6} more" if len(loud) > 6 else ""
        where = f"in {len(loud)} cells ({shown}{more})"
    else:
        where = f"over the run ({noise.sd:.1%} per cell)"
    ask = (
        f"; 'no change' within +-{threshold:.0%} needs about {need} runs a side at that noise"
        if need is not None and need > min(runs_a, runs_b)
        else ""
    )
    return [
        f"warning: run-to-run noise above {NOISE_LEVEL:.0%} per cell, where compare's false "
        f"alarms stay at 5%, {where}: their intervals carry that noise{ask}"
    ]


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
        {tuple(k.values()): sub for k, sub in partition(_with_failures(r), CELL_KEYS)}
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
        cells.append(_resampled(named, tuple(present[:k]), tuple(present[k:]), boot))
    noise = resolve_run_noise(cells, run_noise, (len(side_a), len(side_b)))
    rows += _cell_rows(cells, noise, threshold, alpha, failure_margin)
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
