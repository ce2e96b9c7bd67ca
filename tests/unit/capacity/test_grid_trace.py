"""A trace's plan tables read as a trace's: no load level nor
context where none was set, a request gain where sessions are single requests."""

from __future__ import annotations

import polars as pl

from sessiongen.analysis.whatif import (
    TRACE_LEVEL,
    WHATIF_COLUMNS,
    describe_columns,
    gain_name,
    level_name,
    trace_cells,
)


def test_a_trace_has_no_level_nor_context() -> None:
    frame = pl.DataFrame({"placement": ["fixed"], "context_tokens": [0], "load_level": [4.0]})
    nulled = trace_cells(frame, trace=True)
    assert nulled.row(0) == ("fixed", None, None)
    assert nulled.schema == frame.schema
    assert trace_cells(frame, trace=False).equals(frame)
    assert level_name("closed", trace=True) == TRACE_LEVEL == "open loop, trace timestamps"
    assert level_name("closed") == "concurrency" and level_name("poisson") == "sessions/s"


def test_a_traces_columns_say_so_and_one_request_sessions_make_a_request_gain() -> None:
    columns = ["load_level", "context_tokens", "session_gain", "sessions"]
    plain = dict(describe_columns(columns, [], "closed"))
    assert plain["load_level"] == "sessions in flight at once (closed loop)"
    said = dict(describe_columns(columns, [], "closed", trace=True, one_turn=True))
    assert said["load_level"].startswith(f"null: {TRACE_LEVEL}")
    assert said["context_tokens"].startswith("null:")
    assert said["session_gain"].startswith("request gain")
    assert "session" not in said["sessions"]
    assert (
        gain_name(one_turn=True) == "request gain" and gain_name(one_turn=False) == "session gain"
    )


def test_the_in_flight_columns_are_described() -> None:
    for arm in ("off", "on"):
        for q in ("p50", "p90"):
            assert f"in_flight_{q}_{arm}" in WHATIF_COLUMNS
        assert f"before_first_token_p50_{arm}" in WHATIF_COLUMNS
