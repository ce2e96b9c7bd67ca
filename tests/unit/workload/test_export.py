"""Export a scenario as a Mooncake-style trace, read it back: same lengths, arrivals, sharing."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiongen import scenario
from sessiongen.cli import cli
from sessiongen.design.arrivals import arrival_offsets, think_times
from sessiongen.text.tokenize import cl100k
from sessiongen.workload.export import BlockIds, write_mooncake
from sessiongen.workload.sessions import SessionBuilder, TurnRequest
from sessiongen.workload.textgen import default_generator
from sessiongen.workload.trace import read_trace
from sessiongen.workload.traceprompts import TracePrompts

ENC = cl100k()
BLOCK = 32

RAW: dict[str, Any] = {
    "name": "roundtrip",
    "seed": 3,
    "sessions": {
        "count": 2,
        "turns": 3,
        "initial_context_tokens": [150, 260],
        "question_tokens": 24,
        "answer_tokens": 40,
        "shared_prefix_tokens": 70,  # two whole blocks every session shares, then a partial
        "think_time_s": 2.0,
        "think": "exponential",
    },
    "load": {"arrival": "poisson", "levels": [0.5]},
}


def leading(a: list[Any], b: list[Any]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def blocks(tokens: list[int]) -> list[list[int]]:
    return [tokens[i : i + BLOCK] for i in range(0, len(tokens), BLOCK)]


def tokens_of(req: TurnRequest) -> list[int]:
    return [t for _role, content in req.messages for t in ENC.encode(content)]


def test_export_then_read_gives_the_same_lengths_arrivals_and_sharing(tmp_path: Path) -> None:
    sc = scenario.from_dict(RAW)
    path = tmp_path / "trace.jsonl"
    counts = write_mooncake(sc, "salt", path, block_tokens=BLOCK)
    sessions = SessionBuilder(sc, "salt").sessions()
    reqs = [r for s in sessions for r in s.requests()]  # offsets increase: file order too
    rows = list(read_trace(path, block_tokens=BLOCK))
    assert counts["requests"] == len(rows) == len(reqs) == 12

    offsets = arrival_offsets(sc.load, 0.5, len(sessions), sc.seed)
    tokens = [tokens_of(r) for r in reqs]
    for req, row, toks in zip(reqs, rows, tokens, strict=True):
        assert row.session_id == req.session_id
        assert row.input_length == len(toks) == req.content_tokens
        assert row.output_length == sc.sessions.max_tokens
        if req.turn == 1:
            assert row.timestamp_ms == pytest.approx(offsets[req.session_index] * 1000, abs=1e-3)
            assert row.delay_ms is None
        else:
            pause = think_times(sc.sessions, req.session_index, sc.seed)[req.turn - 1]
            assert row.delay_ms == pytest.approx(pause * 1000, abs=1e-3)
            assert row.timestamp_ms is None
    assert len({r.timestamp_ms for r in rows if r.timestamp_ms is not None}) == 4

    # Shared leading hash ids are exactly the shared leading blocks of the real tokens,
    # and the prompts rebuilt from the trace share exactly as many tokens.
    prompts = TracePrompts(default_generator(), seed=0, salt="replay", block_tokens=BLOCK)
    rebuilt = [ENC.encode(prompts.text(r)) for r in rows]
    pairs = list(itertools.combinations(range(len(rows)), 2))
    sharing = []
    for i, j in pairs:
        shared = leading(list(rows[i].hash_ids), list(rows[j].hash_ids))
        assert shared == leading(blocks(tokens[i]), blocks(tokens[j])), (i, j)
        sharing.append(shared)
        whole = min(shared * BLOCK, rows[i].input_length, rows[j].input_length)
        assert leading(rebuilt[i], rebuilt[j]) == whole, (i, j)
    assert 2 in sharing and max(sharing) > 2  # across sessions and within one


def test_block_ids_are_small_chained_and_in_order_of_first_appearance() -> None:
    ids = BlockIds(2)
    assert ids.of([1, 2, 3, 4, 5]) == [0, 1, 2]
    assert ids.of([1, 2, 3, 4, 6]) == [0, 1, 3]  # only the last block differs
    assert ids.of([3, 4, 1, 2]) == [4, 5]  # the same blocks after other blocks: new ids
    assert ids.of([1, 2, 3]) == [0, 6]  # a partial block is its own block


def test_cli_export_writes_a_trace_and_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    toml = tmp_path / "one.toml"
    toml.write_text(
        'name = "one"\n[sessions]\ncount = 3\nturns = 1\ninitial_context_tokens = 100\n'
        "question_tokens = 20\n",
        encoding="utf-8",
    )
    out = tmp_path / "out" / "one.jsonl"
    runner = CliRunner()
    ok = runner.invoke(cli, ["export", str(toml), "--block-tokens", "64", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    rows = list(read_trace(out, block_tokens=64))
    assert len(rows) == 3 and all(r.session_id is None for r in rows)  # single turns
    bad = runner.invoke(cli, ["export", str(toml), "--set", "sessions.turns=0", "-o", str(out)])
    assert bad.exit_code == 2
    assert bad.output.strip().startswith(f"sessiongen: error: {toml}: sessions.turns")
    assert "Traceback" not in bad.output


SHIPPED = Path(__file__).resolve().parents[3] / "scenarios" / "traces"


@pytest.mark.parametrize("name", ["chat-sessions", "single-requests"])
def test_shipped_traces_are_what_their_scenarios_export(tmp_path: Path, name: str) -> None:
    sc = scenario.load(SHIPPED / f"{name}.toml")
    out = tmp_path / f"{name}.jsonl"
    write_mooncake(sc, "sessiongen", out)  # the CLI's default salt
    assert out.read_bytes() == (SHIPPED / f"{name}.jsonl").read_bytes()
    rows = list(read_trace(SHIPPED / f"{name}.jsonl"))
    assert all((r.session_id is None) == (name == "single-requests") for r in rows)
    assert len({r.hash_ids[0] for r in rows}) == 1  # the shared system prompt's first block


@pytest.mark.parametrize("name", ["chat-sessions", "single-requests"])
def test_a_trace_scenario_exports_as_the_trace_it_replays(tmp_path: Path, name: str) -> None:
    sc = scenario.load(
        SHIPPED / "chat-replay.toml",
        [f"sessions.trace.file={name}.jsonl", "sessions.trace.speedup=1"],
    )
    out = tmp_path / f"{name}.jsonl"
    write_mooncake(sc, "another-salt", out)
    # The shipped traces number their ids in order of first appearance, as export does.
    assert out.read_bytes() == (SHIPPED / f"{name}.jsonl").read_bytes()
