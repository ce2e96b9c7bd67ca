"""analysis.frames.unit_matrix: each session's values in row order, one row per unit."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from sessiongen.analysis.frames import unit_matrix


def _by_loop(frame: pl.DataFrame, units: list[Any]) -> np.ndarray:
    """The definition, one unit at a time."""
    rows = [
        [
            v
            for s, v in zip(frame["session_index"], frame["ttft_s"], strict=True)
            if s == u and v is not None
        ]
        for u in units
    ]
    per = [
        [
            v
            for s, v in zip(frame["session_index"], frame["ttft_s"], strict=True)
            if s == k and v is not None
        ]
        for k in set(frame["session_index"].to_list())
    ]
    width = max((len(r) for r in per), default=1) or 1
    mat = np.full((len(units), width), np.nan)
    for i, r in enumerate(rows):
        mat[i, : len(r)] = r
    return mat


def test_unit_matrix_is_each_units_values_in_order_nan_padded() -> None:
    rng = np.random.default_rng(3)  # fixed: the same 300 frames in every run
    for _ in range(300):
        n = int(rng.integers(0, 40))
        values = [None if rng.random() < 0.2 else float(v) for v in rng.random(n)]
        frame = pl.DataFrame(
            {
                "session_index": pl.Series(rng.integers(0, 12, n), dtype=pl.Int64),
                "ttft_s": pl.Series(values, dtype=pl.Float64),
            }
        )
        # units may miss sessions of the frame and name sessions it does not have
        units = sorted(set(rng.integers(0, 14, int(rng.integers(0, 10))).tolist()))
        want, got = _by_loop(frame, units), unit_matrix(frame, units)
        assert got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=True)
