"""Small helpers for building analysis frames from a run's requests."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl


def drop_single_context(frame: pl.DataFrame) -> pl.DataFrame:
    """Drop ``context_tokens`` from a frame for display when it holds one value."""
    if "context_tokens" in frame.columns and frame["context_tokens"].n_unique() <= 1:
        return frame.drop("context_tokens")
    return frame


def finite_or_none(value: float | None) -> float | None:
    """A float, or None for NaN/None (frames hold nulls, not NaN)."""
    return None if value is None or math.isnan(value) else float(value)


def partition(
    frame: pl.DataFrame, keys: Sequence[str]
) -> list[tuple[dict[str, Any], pl.DataFrame]]:
    """The frame split by ``keys``: (key values by name, sub-frame) in first-seen order."""
    if frame.is_empty():
        return []
    parts = frame.partition_by(list(keys), as_dict=True, maintain_order=True)
    return [(dict(zip(keys, key, strict=True)), sub) for key, sub in parts.items()]


def frame_from_rows(
    rows: list[dict[str, Any]],
    keys: Sequence[str],
    source: pl.DataFrame,
    values: dict[str, pl.DataType],
) -> pl.DataFrame:
    """Rows as a frame: key columns typed as in ``source``, then ``values`` (empty-safe)."""
    schema: dict[str, pl.DataType] = {k: source.schema[k] for k in keys}
    schema.update(values)
    return pl.DataFrame(rows, schema=schema)


def sample(frame: pl.DataFrame, column: str = "ttft_s") -> npt.NDArray[np.float64]:
    """A column's non-null values as a float array."""
    return frame[column].drop_nulls().to_numpy().astype(np.float64)


def rows_frame(rows: Sequence[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Rows as a frame with exactly ``schema``'s columns (missing values become null)."""
    cols: dict[str, list[Any]] = {name: [row.get(name) for row in rows] for name in schema}
    return pl.DataFrame(cols, schema=schema)
