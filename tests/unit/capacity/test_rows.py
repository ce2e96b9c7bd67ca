"""The planner's rows become frames with exactly ``requests.parquet``'s schema."""

from __future__ import annotations

import polars as pl

from sessiongen.capacity.rows import BlockFacts, PlannedRecords, PlannedRow
from sessiongen.records.format import REQUEST_SCHEMA


def _row(turn: int, *, warmup: bool = False) -> PlannedRow:
    return PlannedRow(
        "s1", 0, 512, turn, 1, turn > 1, warmup, 1000, 900, 800, 10, 0.0, 0.5, 0.5, 2.0,
        3.0, 700, 100, None, None, 0.5, 1.0, 20.0, 0.1, None, None, None, None,
    )  # fmt: skip


def _facts(block: int, cache: str) -> BlockFacts:
    return BlockFacts(
        run_id="r", block=block, block_in_placement=block, placement="fixed", cache=cache,
        load_level=2.0, routed=False,
    )  # fmt: skip


def test_every_field_of_a_row_is_a_column_of_the_schema() -> None:
    assert set(PlannedRow._fields) <= set(REQUEST_SCHEMA)
    assert set(_facts(0, "on").columns()) <= set(REQUEST_SCHEMA) - set(PlannedRow._fields)


def test_rows_of_two_blocks_carry_their_blocks_facts() -> None:
    records = PlannedRecords(batch=3)  # a batch boundary inside a block, too
    records.begin(_facts(0, "off"))
    for k in (1, 2):
        records.add(_row(k))
    records.begin(_facts(1, "on"))
    for k in (1, 2, 3, 4):
        records.add(_row(k))
    frame = records.frame()
    assert frame.schema == pl.Schema(REQUEST_SCHEMA)
    assert frame["cache"].to_list() == ["off"] * 2 + ["on"] * 4
    assert frame["turn"].to_list() == [1, 2, 1, 2, 3, 4]
    assert frame["status"].unique().to_list() == ["ok"]
    assert frame["replica_source"].unique().to_list() == ["placement"]
    assert frame["output_text"].null_count() == frame.height
    assert frame["load_level"].to_list() == [2.0] * 6


def test_no_rows_is_an_empty_frame_with_the_schema() -> None:
    assert PlannedRecords().frame().schema == pl.Schema(REQUEST_SCHEMA)


def test_a_planned_row_takes_each_field_from_the_facts_or_the_engine() -> None:
    from sessiongen.capacity.virtual import planned_row
    from sessiongen.experiment.facts import TurnFacts
    from sessiongen.sim.virtual import RequestResult

    facts = TurnFacts(session_id="s-7", session_index=7, context_tokens=3, turn=2,
                      content_tokens=11, expected="needle", prompt_digest="digest",
                      trace_line=5, trace_shared_blocks=6, trace_shared_tokens=70,
                      trace_reuse_distance=8, replica=1, warmup=False, cross_replica=True,
                      queue_s=0.25, arrival_s=12.0, think_s=1.5)  # fmt: skip
    result = RequestResult(tag=None, replica=1, prompt_tokens=100, output_tokens=20,
                           arrival_s=10.0, admitted_s=10.5, first_token_s=11.0,
                           finished_s=13.0, local_hit_tokens=30, pool_hit_tokens=40,
                           preemptions=0, kv_blocks_at_admission=0, running_at_admission=0,
                           waiting_at_admission=0)  # fmt: skip
    row = planned_row(facts, result, start_s=1000.0)
    assert row._asdict() == {
        "session_id": "s-7",
        "session_index": 7,
        "context_tokens": 3,
        "turn": 2,
        "replica": 1,
        "cross_replica": True,
        "warmup": False,
        "prompt_tokens": 100,
        "content_tokens": 11,
        "cached_tokens": 70,
        "completion_tokens": 20,
        "queue_s": 0.25,
        "ttfb_s": 1.0,
        "ttft_s": 1.0,
        "e2e_s": 3.0,
        "send_s": 1010.0,
        "local_hit_tokens": 30,
        "external_hit_tokens": 40,
        "expected": "needle",
        "prompt_digest": "digest",
        "server_ttft_s": 1.0,
        "arrival_s": 12.0,
        "think_s": 1.5,
        "server_queue_s": 0.5,
        "trace_line": 5,
        "trace_shared_blocks": 6,
        "trace_shared_tokens": 70,
        "trace_reuse_distance": 8,
    }
