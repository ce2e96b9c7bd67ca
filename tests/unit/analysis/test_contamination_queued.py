"""A trace request that queued while another computed its shared blocks is not
contamination: hand-built trace runs, no replay."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen import analysis
from sessiongen.records.meta import RunMeta
from sessiongen.records.run import Run


def _run(rows: list[dict[str, Any]]) -> Run:
    meta = RunMeta.from_manifest({"scenario": {"sessions": {"source": "trace"}}})
    base: dict[str, Any] = {
        "block": 0, "placement": "fixed", "cache": "on", "context_tokens": 0, "turn": 1,
        "replica": 0, "prompt_tokens": 2000, "content_tokens": 1990, "cached_tokens": 0,
        "local_hit_tokens": 0, "external_hit_tokens": 0, "trace_shared_tokens": 0,
        "server_queue_s": 0.0, "ttft_s": 1.0, "status": "ok",
    }  # fmt: skip
    frame = pl.DataFrame([{**base, **r} for r in rows], infer_schema_length=None)
    return Run(path=Path("."), meta=meta, requests=frame)


#: Line 1 shares its first 1,024 tokens with line 2 only (a later line: the trace says
#: line 1 shares nothing). Line 2 arrives a second after line 1, is admitted at once and
#: has computed them by 2.5 s; line 1 waits in the queue until 23 s.
QUEUED = [
    {"session_id": "a", "trace_line": 1, "send_s": 0.0, "server_queue_s": 23.0,
     "ttft_s": 24.0, "cached_tokens": 1024, "local_hit_tokens": 1024},
    {"session_id": "b", "trace_line": 2, "send_s": 1.0, "ttft_s": 1.5,
     "trace_shared_tokens": 0},
]  # fmt: skip


def test_a_request_that_queued_while_another_computed_its_prefix_is_not_flagged() -> None:
    run = _run(QUEUED)
    assert analysis.contamination(run).is_empty()


def test_a_hit_before_any_other_request_could_compute_it_is_still_flagged() -> None:
    # admitted at once (no queue): line 2 had not even been sent
    early = [{**QUEUED[0], "server_queue_s": 0.0, "ttft_s": 1.0}, QUEUED[1]]
    found = analysis.contamination(_run(early))
    assert found["session_id"].to_list() == ["a"]
    # queued, but line 2 is too short to hold the hit
    short = [QUEUED[0], {**QUEUED[1], "prompt_tokens": 512}]
    assert analysis.contamination(_run(short))["session_id"].to_list() == ["a"]
    # queued behind an *earlier* line: the trace already counts what earlier lines share
    earlier = [QUEUED[0], {**QUEUED[1], "trace_line": 0}]
    assert analysis.contamination(_run(earlier))["session_id"].to_list() == ["a"]
    # another run block's request (an earlier block's cache) explains nothing
    other_block = [QUEUED[0], {**QUEUED[1], "block": 1}]
    assert analysis.contamination(_run(other_block))["session_id"].to_list() == ["a"]


def test_with_the_pool_off_only_the_same_replica_can_have_computed_it() -> None:
    off = [{**r, "cache": "off"} for r in QUEUED]
    assert analysis.contamination(_run(off)).is_empty()
    elsewhere = [off[0], {**off[1], "replica": 1}]
    assert analysis.contamination(_run(elsewhere))["session_id"].to_list() == ["a"]
    # and an external hit with the pool off stays contamination, queued or not
    external = [{**off[0], "external_hit_tokens": 1024}, off[1]]
    assert analysis.contamination(_run(external))["session_id"].to_list() == ["a"]


def test_without_the_servers_queue_its_first_token_bounds_the_admission() -> None:
    unknown = [{**QUEUED[0], "server_queue_s": None}, QUEUED[1]]
    assert analysis.contamination(_run(unknown)).is_empty()
    counted = analysis.cache_attribution(_run(unknown))
    assert counted["contamination"].sum() == 0
    flagged = replace(_run(unknown), requests=_run(unknown).requests.with_columns(
        pl.when(pl.col("session_id") == "a").then(0.5).otherwise(pl.col("ttft_s")).alias("ttft_s")
    ))  # fmt: skip
    assert analysis.contamination(flagged)["session_id"].to_list() == ["a"]
