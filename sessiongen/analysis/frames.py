"""Small helpers for building analysis frames from a run's requests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
) -> list[tuple[dict[str, object], pl.DataFrame]]:
    """The frame split by ``keys``: (key values by name, sub-frame) in first-seen order."""
    if frame.is_empty():
        return []
    parts = frame.partition_by(list(keys), as_dict=True, maintain_order=True)
    return [(dict(zip(keys, key, strict=True)), sub) for key, sub in parts.items()]


def frame_from_rows(
    rows: Sequence[Mapping[str, object]],
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


def unit_matrix(
    frame: pl.DataFrame, units: Sequence[Any], column: str = "ttft_s"
) -> npt.NDArray[np.float64]:
    """A column's values per session as a units x values matrix, NaN-padded.

    Row ``i`` holds the non-null values of session ``units[i]`` (one per block, or per
    turn, ...), so rows of two such matrices with the same ``units`` can be resampled
    together (a paired, cluster bootstrap: :mod:`sessiongen.analysis.stats`).
    """
    # Each value's place: its unit's row, its rank among its session's values in row
    # order; then one scatter (a loop over 12k sessions cost a block's decision 15 ms).
    values = frame.select("session_index", pl.col(column).cast(pl.Float64).alias("_value")).filter(
        pl.col("_value").is_not_null()
    )
    values = values.with_columns(pl.int_range(pl.len()).over("session_index").alias("_at"))
    at = values["_at"].to_numpy()
    width = int(at.max()) + 1 if at.size else 1
    mat = np.full((len(units), width), np.nan)
    if values.height and len(units):
        rows = pl.DataFrame(
            {"session_index": pl.Series(list(units), dtype=frame.schema["session_index"]),
             "_row": np.arange(len(units))}
        )  # fmt: skip
        placed = values.join(rows, on="session_index", how="inner")
        mat[placed["_row"].to_numpy(), placed["_at"].to_numpy()] = placed["_value"].to_numpy()
    return mat


def session_units(frame: pl.DataFrame) -> list[Any] | None:
    """The sorted session indices of ``frame``, or None when some row has none."""
    if frame.is_empty() or frame["session_index"].null_count():
        return None
    return sorted(frame["session_index"].unique().to_list())


def clusters(frame: pl.DataFrame, column: str = "ttft_s") -> npt.NDArray[np.float64]:
    """What to resample for one sample: its sessions (a units x values matrix) when every
    row has one, else its requests (1-D), which the bootstrap then treats as independent."""
    units = session_units(frame)
    return sample(frame, column) if units is None else unit_matrix(frame, units, column)


def rows_frame(
    rows: Sequence[Mapping[str, object]], schema: dict[str, pl.DataType]
) -> pl.DataFrame:
    """Rows as a frame with exactly ``schema``'s columns (missing values become null)."""
    cols: dict[str, list[object]] = {name: [row.get(name) for row in rows] for name in schema}
    return pl.DataFrame(cols, schema=schema)
