"""A planned run's request records, kept as rows of what varies and written as columns.

A planned day has a million requests. As :class:`~sessiongen.records.format.RequestRecord`
objects (55 fields, frozen) they cost more to build and to turn into a frame than the
engine takes to plan them, so the planner hands over a :class:`PlannedRow` per request:
a named tuple of the fields that vary between requests. What a block holds constant
(its run, placement, arm, level) and what the planner never measures (streaming
figures, answers, HTTP) is set once per block as :class:`BlockFacts` and broadcast when
the rows become a frame. The frame has exactly ``requests.parquet``'s schema, the
columns' order included, so a planned run reads like any other
(``tests/unit/capacity/test_rows.py`` checks every field of a row against the schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import polars as pl

from sessiongen.records.format import REQUEST_SCHEMA


class PlannedRow(NamedTuple):
    """What varies from one planned request to the next (``requests.parquet`` columns)."""

    session_id: str | None
    session_index: int | None
    context_tokens: int
    turn: int
    replica: int
    cross_replica: bool
    warmup: bool
    prompt_tokens: int
    content_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_s: float
    ttfb_s: float
    ttft_s: float
    e2e_s: float
    send_s: float
    local_hit_tokens: int
    external_hit_tokens: int
    expected: str | None
    prompt_digest: str | None
    server_ttft_s: float
    arrival_s: float | None
    think_s: float | None
    server_queue_s: float
    trace_line: int | None
    trace_shared_blocks: int | None
    trace_shared_tokens: int | None
    trace_reuse_distance: int | None

    # What the block's progress reads of a request (infra.progress.Counted).
    @property
    def status(self) -> str:
        return "ok"

    @property
    def loop_lag_flag(self) -> bool:
        return False


@dataclass(frozen=True)
class BlockFacts:
    """What every request of one planned block shares."""

    run_id: str
    block: int
    block_in_placement: int
    placement: str
    cache: str
    load_level: float | None  # None: a trace (its timestamps are its load)
    routed: bool  # a model of a router placed its turns (else the client's placement)

    def columns(self) -> dict[str, object]:
        """The constant columns of the block's records (all others not in a row: null)."""
        return {
            "run_id": self.run_id,
            "block": self.block,
            "block_in_placement": self.block_in_placement,
            "placement": self.placement,
            "cache": self.cache,
            "status": "ok",
            "http_status": 200,
            "loop_lag_flag": False,
            "load_level": self.load_level,
            "hit_source": "planner",
            "replica_source": "planner" if self.routed else "placement",
        }


_ROW_SCHEMA = {name: REQUEST_SCHEMA[name] for name in PlannedRow._fields}


class PlannedRecords:
    """Rows of every block so far, turned into frames a batch at a time (tuples of a
    day's requests would take as much memory as the engine)."""

    def __init__(self, batch: int = 50_000) -> None:
        self.batch = batch
        self._rows: list[PlannedRow] = []
        self._facts: BlockFacts | None = None
        self._frames: list[pl.DataFrame] = []

    def begin(self, facts: BlockFacts) -> None:
        """The rows that follow belong to a block with these facts."""
        self._flush()
        self._facts = facts

    def add(self, row: PlannedRow) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.batch:
            self._flush()

    def frame(self) -> pl.DataFrame:
        """Every record so far, as one frame with ``requests.parquet``'s schema."""
        self._flush()
        if not self._frames:
            return pl.DataFrame(schema=REQUEST_SCHEMA)
        return pl.concat(self._frames)

    def _flush(self) -> None:
        if not self._rows:
            return
        assert self._facts is not None, "rows before any block began"
        # transposed in Python, then built as columns: a fifth of the time polars takes
        # to build the same frame from row tuples
        # (strict=False: values cast to the schema as the row-wise build did)
        columns = dict(zip(_ROW_SCHEMA, zip(*self._rows, strict=True), strict=True))
        rows = pl.DataFrame(columns, schema=_ROW_SCHEMA, strict=False)
        constants = self._facts.columns()
        self._rows = []
        self._frames.append(
            rows.select(
                pl.col(name)
                if name in _ROW_SCHEMA
                else pl.lit(constants.get(name), dtype).alias(name)
                for name, dtype in REQUEST_SCHEMA.items()
            )
        )
