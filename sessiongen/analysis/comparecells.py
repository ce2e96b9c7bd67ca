"""A compared cell's requests in every run of both sides, resampled once (:class:`CellData`).

Failed requests count as slower than any finished one (``_ttft`` is +inf for them), and
sessions are the bootstrap's units wherever every run holds the same ones
(:mod:`.compare`'s docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from sessiongen.analysis import stats
from sessiongen.analysis.frames import unit_matrix
from sessiongen.analysis.stats import Bootstrap
from sessiongen.records.run import Run


def with_failures(run: Run) -> pl.DataFrame:
    """The run's requests with ``_ttft``: TTFT, +inf for a failed request."""
    failed = pl.col("status") != "ok"
    ttft = pl.when(failed).then(float("inf")).otherwise(pl.col("ttft_s"))
    return run.requests.with_columns(_ttft=ttft, _failed=failed.cast(pl.Float64))


@dataclass(frozen=True)
class CellData:
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


def resampled(
    key: dict[str, object],
    a: tuple[pl.DataFrame, ...],
    b: tuple[pl.DataFrame, ...],
    boot: Bootstrap,
) -> CellData:
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
    return CellData(key, a, b, units, point, draws)


def _matrix_of_own(sub: pl.DataFrame) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A run's own sessions as units, or its requests when some row has no session."""
    if sub.is_empty() or sub["session_index"].null_count():
        return sub["_ttft"].drop_nulls().to_numpy().astype(np.float64)
    return unit_matrix(sub, sorted(sub["session_index"].unique().to_list()), "_ttft")


def _median_s(subs: Sequence[pl.DataFrame]) -> float | None:
    values = np.concatenate([s["_ttft"].drop_nulls().to_numpy() for s in subs])
    if values.size == 0:
        return None
    return float(np.median(np.where(np.isposinf(values), stats.FAILED, values)))


def cell_sizes(cell: CellData) -> dict[str, object]:
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


def fails_more(cell: CellData) -> bool:
    """B's share of failed requests in the cell is above A's."""

    def share(subs: Sequence[pl.DataFrame]) -> float:
        total = sum(s.height for s in subs)
        return sum(float(s["_failed"].sum()) for s in subs) / total if total else 0.0

    return share(cell.subs_b) > share(cell.subs_a)
