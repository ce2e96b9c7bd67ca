"""What a trace implies: counts, span and the tokens an infinite prefix cache would serve."""

from __future__ import annotations

from pathlib import Path

import orjson
from click.testing import CliRunner

from sessiongen.cli import cli
from sessiongen.workload.trace import TraceRequest
from sessiongen.workload.tracestats import summarize


def req(
    line: int, ids: list[int], n: int, ts: float | None = 0.0, sid: str | None = None
) -> TraceRequest:
    return TraceRequest(line, ts, n, 7, tuple(ids), sid, None if ts is not None else 5.0)


def test_reuse_counts_leading_blocks_seen_before_only() -> None:
    s = summarize(
        [
            req(1, [0, 1], 1000),  # nothing seen yet
            req(2, [0, 1, 2], 1500, 10.0, "a"),  # 512 + 512
            req(3, [0, 3], 600, None, "a"),  # 512
            req(4, [0, 1], 1000, 30.0),  # 512 + the partial 488
            req(5, [7, 1], 1000, 40.0, "b"),  # 1 was seen, but not as a leading block
            req(6, [2**40], 10, 50.0),
            req(7, [2**40], 10, 60.0),  # a huge id, seen before
        ],
        block_tokens=512,
    )
    # a and b, and the 4 lines without a session_id (a one-turn session each, as replayed)
    assert (s.requests, s.sessions, s.single_requests, s.span_ms) == (7, 6, 4, 60.0)
    assert (s.input_tokens, s.output_tokens) == (5120, 49)
    assert (s.longest_input, s.longest_line) == (1500, 2)
    assert s.distinct_blocks == 6
    assert s.reusable_tokens == 1024 + 512 + 1000 + 10
    assert s.reusable_share == s.reusable_tokens / 5120


def test_trace_info_reads_a_trace_and_refuses_a_bad_one_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 2500, "input_length": 900, "output_length": 5, "hash_ids": [0, 2]},
    ]
    good.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    ok = CliRunner().invoke(cli, ["trace-info", str(good)])
    assert ok.exit_code == 0, ok.output
    # One-turn requests are sessions, as the replay makes them ("0 sessions")
    assert "2 requests, 2 sessions (2 of one request: no session_id), last arrival at 2.5 s" in (
        ok.output
    )
    helped = CliRunner().invoke(cli, ["trace-info", "--help"]).output
    assert "--speedup" in helped and "sessions.trace.speedup" in helped
    assert "serves 26.9% of input tokens" in ok.output  # 512 of 1900
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(orjson.dumps(rows[1]) + b"\n" + orjson.dumps(rows[0]) + b"\n")
    out = CliRunner().invoke(cli, ["trace-info", str(bad)])
    assert out.exit_code == 2
    assert out.output == (
        f"sessiongen: error: {bad}: line 2: timestamp: expected >= 2500 (line 1), got 0: "
        "timestamps must not decrease down the file\n"
    )
