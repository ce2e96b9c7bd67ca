"""A trace as the replay's sessions: turns, times, prompts, placement keys, refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiongen import replay, scenario
from sessiongen.errors import ScenarioError
from sessiongen.workload import tracesessions
from sessiongen.workload.sessions import SessionBuilder
from sessiongen.workload.trace import TraceRequest, read_trace
from sessiongen.workload.tracesessions import trace_sessions
from tests.support.paths import ROOT

CHAT = ROOT / "scenarios/traces/chat-replay.toml"


def write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_lines_become_sessions_in_file_order_with_their_pauses(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {
            "session_id": "a",
            "timestamp": 1000,
            "input_length": 4,
            "output_length": 2,
            "hash_ids": [1],
        },
        {"timestamp": 1500, "input_length": 4, "output_length": 3, "hash_ids": [2]},
        {
            "session_id": "a",
            "delay": 700,
            "input_length": 8,
            "output_length": 2,
            "hash_ids": [1, 3],
        },
        {
            "session_id": "b",
            "timestamp": 4000,
            "input_length": 4,
            "output_length": 2,
            "hash_ids": [4],
        },
        # a later turn with a timestamp and no delay waits the gap to its session's last one
        {
            "session_id": "a",
            "timestamp": 6000,
            "input_length": 8,
            "output_length": 2,
            "hash_ids": [1, 5],
        },
        {"session_id": "b", "delay": 0, "input_length": 4, "output_length": 2, "hash_ids": [4]},
    ]
    path = write_trace(tmp_path / "t.jsonl", rows)
    sessions = trace_sessions(read_trace(path, block_tokens=4, speedup=2.0), 4)
    assert [s.session_id for s in sessions] == ["a", "trace-line-2", "b"]
    assert [s.start_s for s in sessions] == [0.0, 0.25, 1.5]
    a, single, b = sessions
    assert [t.request.line for t in a.turns] == [1, 3, 5]
    assert [t.pause_s for t in a.turns] == [0.0, 0.35, 2.5]  # (6000 - 1000) / 2 ms
    assert [t.pause_s for t in single.turns] == [0.0]
    assert [t.request.line for t in b.turns] == [4, 6]
    assert [t.facts.shared_blocks for t in a.turns] == [0, 1, 1]
    assert b.turns[1].facts.shared_blocks == 1


def test_a_trace_turn_sends_its_whole_prompt_and_its_output_length() -> None:
    sc = scenario.load(CHAT)
    builder = SessionBuilder(sc, "salt")
    sessions = builder.sessions()
    assert len(sessions) == 6 and all(s.turns == 3 for s in sessions)
    assert builder.starts(1.0) == [s.trace.start_s for s in sessions if s.trace is not None]
    first = sessions[0]
    reqs = list(first.requests())
    lines = [orjson.loads(x) for x in (CHAT.parent / "chat-sessions.jsonl").read_bytes().split()]
    for req in reqs:
        row = lines[req.turn - 1]
        body = req.body(sc)
        assert [m["role"] for m in body["messages"]] == ["user"]  # no answer appended
        assert builder.generator.count(body["messages"][0]["content"]) == row["input_length"]
        assert body["max_tokens"] == body["min_tokens"] == row["output_length"]
        assert body["ignore_eos"] is True
        assert req.trace_line == req.turn and req.context_tokens == 0
        assert b"".join(req.body_parts(sc)) == orjson.dumps(body)
    assert [r.prefix.shared_blocks for r in reqs if r.prefix] == [0, 5, 5]
    assert first.pauses()[0] == 0.0 and first.pauses()[1] == pytest.approx(5.345502 / 2)
    assert all(r.home_key == 0 for r in reqs)


def test_placement_can_key_on_the_prefix_root() -> None:
    sc = scenario.load(
        CHAT,
        ["sessions.trace.file=single-requests.jsonl", "sessions.trace.placement_key=prefix"],
    )
    sessions = SessionBuilder(sc, "salt").sessions()
    assert len(sessions) == 12 and all(s.turns == 1 for s in sessions)
    reqs = [s.request(1) for s in sessions]
    assert [r.session_index for r in reqs] == list(range(12))
    assert {r.home_key for r in reqs} == {0}  # every line of this trace starts with block 0


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        (["sessions.probe=needle"], "sessions.probe: does not apply to a trace source"),
        (['load.arrival="poisson"', "load.levels=[1.0]"], "load: a trace's arrivals are"),
    ],
)
def test_what_a_trace_replay_does_not_do_is_refused(overrides: list[str], where: str) -> None:
    with pytest.raises(ScenarioError, match=where):
        SessionBuilder(scenario.load(CHAT, overrides), "salt")


def test_prompts_longer_than_the_model_are_refused_before_any_run(tmp_path: Path) -> None:
    sc = scenario.load(CHAT, ["target.sim.max_model_len=4000"])
    runs = tmp_path / "runs"
    with pytest.raises(ScenarioError) as info:
        replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    # input + output above 4,000: turns 2 and 3 (4,104 and 4,344) of the three sessions
    # that start from 3,664 tokens; the first of the longest is line 12.
    assert str(info.value).endswith(
        "sessions.trace: 6 requests need more than the model's max_model_len = 4000 tokens "
        "(input_length + output_length); the longest needs 4344 (line 12)"
    ), str(info.value)
    assert not runs.exists() or not any(runs.iterdir())


def test_a_trace_is_parsed_once_for_the_same_bytes_and_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plan's arms, configurations and replicates each asked for the trace's sessions,
    # and each parsed the file again (1.8 s of CPU a time on a 12k-request trace).
    trace = tmp_path / "t.jsonl"
    rows: list[dict[str, object]] = [
        {"session_id": "a", "timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]},
        {
            "session_id": "a",
            "delay": 5,
            "input_length": 600,
            "output_length": 2,
            "hash_ids": [1, 2],
        },
    ]
    write_trace(trace, rows)
    parsed: list[Path] = []

    def counting(path: Path, **kwargs: Any) -> Iterator[TraceRequest]:
        parsed.append(path)
        return read_trace(path, **kwargs)

    monkeypatch.setattr(tracesessions, "read_trace", counting)
    sc = scenario.load(CHAT, [f"sessions.trace.file={trace}"])
    first, again = tracesessions.load_sessions(sc), tracesessions.load_sessions(sc)
    assert first == again and len(parsed) == 1
    assert [len(s.turns) for s in first] == [2]
    # other settings, or other bytes at the same path, are parsed anew
    tracesessions.load_sessions(
        scenario.load(CHAT, [f"sessions.trace.file={trace}", "sessions.trace.speedup=3"])
    )
    write_trace(trace, rows[:1])
    changed = tracesessions.load_sessions(sc)
    assert len(parsed) == 3 and [len(s.turns) for s in changed] == [1]
