"""Requests in flight as measured from the records' send, first-token and end times:
hand-made runs whose counts over time are known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessiongen.analysis import load
from sessiongen.analysis.frames import rows_frame
from sessiongen.records.format import REQUEST_SCHEMA
from sessiongen.records.meta import RunMeta
from sessiongen.records.run import Run


def make_run(rows: list[dict[str, Any]]) -> Run:
    base = {"status": "ok", "warmup": False, "context_tokens": 0, "turn": 1,
            "placement": "fixed", "load_level": 4.0, "block": 0}  # fmt: skip
    frame = rows_frame([{**base, **r} for r in rows], REQUEST_SCHEMA)
    return Run(Path("x"), RunMeta.from_manifest({"run_id": "x"}), frame)


def _request(
    i: int, cache: str, send: float, ttft: float | None, e2e: float | None, **extra: Any
) -> dict[str, Any]:
    return {"session_id": f"{cache}{i}", "cache": cache, "send_s": send, "ttft_s": ttft,
            "e2e_s": e2e, "block": 0 if cache == "off" else 1, **extra}  # fmt: skip


def test_in_flight_counts_are_time_weighted_per_arm() -> None:
    """OFF: three requests over [0, 10): one alone for 6 s, three at once for 4 s
    (p50 1, p90 3). ON: one request at a time, ten of them back to back (p50 = p90 = 1)."""
    off = [
        _request(0, "off", 0.0, 3.0, 10.0),
        _request(1, "off", 6.0, 3.0, 4.0),
        _request(2, "off", 6.0, 1.0, 4.0),
    ]
    on = [_request(i, "on", float(i), 0.5, 1.0) for i in range(10)]
    table = load.in_flight_table(make_run(off + on))
    assert table.columns == ["placement", "context_tokens", "load_level", "cache",
                             *load.IN_FLIGHT_COLUMNS]  # fmt: skip
    rows = {r["cache"]: r for r in table.iter_rows(named=True)}
    assert (rows["off"]["in_flight_p50"], rows["off"]["in_flight_p90"]) == (1.0, 3.0)
    assert (rows["on"]["in_flight_p50"], rows["on"]["in_flight_p90"]) == (1.0, 1.0)
    # before the first token: OFF has one for 0..3 s and 7..9, two for 6..7, none for
    # the other 4 s of 10: the median is 1
    assert rows["off"]["before_first_token_p50"] == pytest.approx(1.0)
    # ON: one waits for the first half of each second, none for the second half (and
    # the last): the lower median, 0
    assert rows["on"]["before_first_token_p50"] == 0.0


def test_wide_gives_the_what_if_columns_per_arm() -> None:
    off = [_request(i, "off", 0.0, 1.0, 5.0) for i in range(4)]  # four at once, 5 s
    on = [_request(0, "on", 0.0, 1.0, 5.0)]
    wide = load.in_flight_table(make_run(off + on), wide=True)
    assert wide.height == 1
    row = wide.row(0, named=True)
    assert (row["in_flight_p50_off"], row["in_flight_p50_on"]) == (4.0, 1.0)
    assert (row["in_flight_p90_off"], row["in_flight_p90_on"]) == (4.0, 1.0)
    assert {"placement", "context_tokens", "load_level"} <= set(wide.columns)
    assert "cache" not in wide.columns


def test_blocks_pool_their_time_and_unfinished_requests_count_to_their_first_token() -> None:
    """Two blocks of one arm, each one request alone for 4 s: pooled, never two at once
    (their clocks overlap but are apart). A request that failed without an end counts
    to its first token; one with neither does not count."""
    rows = [
        _request(0, "on", 0.0, 1.0, 4.0),
        _request(1, "on", 0.0, 1.0, 4.0, block=7),
        _request(2, "on", 0.0, 4.0, None, block=7, status="stream_error"),
        _request(3, "on", 0.0, None, None, block=7, status="connect_error"),
    ]
    (row,) = load.in_flight_table(make_run(rows)).iter_rows(named=True)
    # block 0: one for 4 s; block 7: two for 4 s; pooled: half the time 1, half 2
    assert (row["in_flight_p50"], row["in_flight_p90"]) == (1.0, 2.0)
