"""Run-to-run noise for :mod:`.compare`: where it comes from (given, replicate runs, the
trend store, assumed), each cell's own, and the notes that say which regime a comparison is in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sessiongen.analysis import hypotheses, stats
from sessiongen.analysis.comparecells import CellData
from sessiongen.infra.lazy import lazy_module

if TYPE_CHECKING:
    from scipy import stats as sps
else:
    sps = lazy_module("scipy.stats")


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


def _replicate_groups(cells: Sequence[CellData]) -> list[tuple[Any, Any]]:
    """Per cell and side with several runs: the runs' log medians and the sampling
    variance of each one's deviation from their mean (robust, corrected for the session
    count, as the latency test's). Cells where a resampled median landed on failed
    requests are left out: their log draws jump to log(FAILED) and would swamp the rest."""
    return [group for cell in cells for group in _cell_groups(cell)]


def _cell_groups(cell: CellData) -> list[tuple[Any, Any]]:
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


def cell_noise(cells: Sequence[CellData]) -> dict[tuple[Any, ...], CellNoise]:
    """Each cell's own run-to-run SD from its replicate runs (both sides pooled).

    The method of moments of :func:`~.hypotheses.replicate_noise` on the cell alone: the
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
        tau, df = hypotheses.replicate_noise(_cell_groups(cell))
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
    cells: Sequence[CellData], given: RunNoise | None, runs: tuple[int, int]
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
    tau, cell_df = hypotheses.replicate_noise(_replicate_groups(cells))
    df = sum(k - 1 for k in runs)
    if cell_df > 0 and df > 0 and math.isfinite(tau):
        source = (
            f"estimated from the spread between the runs of a side, at its "
            f"{REPLICATE_UPPER:.0%} upper bound (point {tau:.1%})"
        )
        return RunNoise(_upper(tau, df), source, float(df), cell_noise(cells))
    return DEFAULT_RUN_NOISE


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
