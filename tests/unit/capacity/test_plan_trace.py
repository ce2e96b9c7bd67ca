"""A trace scenario planned on the virtual clock: the trace's sessions, schedule, placements
and facts, as replay sends them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.plan import plan
from sessiongen.capacity.prompts import trace_prompt
from sessiongen.capacity.virtual import Tokens, block_ids, virtual_replay
from sessiongen.records.run import load_run
from sessiongen.sim import compiled
from sessiongen.sim.cache import _R_INV, PromptKeys, _weights
from sessiongen.workload.sessions import SessionBuilder
from tests.support.paths import ROOT

CHAT = ROOT / "scenarios/traces/chat-replay.toml"


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    sc = scenario.load(CHAT, ['design.blocks=["off","on"]'])
    run_dir = virtual_replay(sc, tmp_path_factory.mktemp("plan"))
    return pl.read_parquet(run_dir / "requests.parquet").filter(~pl.col("warmup"))


def test_every_line_is_planned_on_the_traces_schedule(planned: pl.DataFrame) -> None:
    sc = scenario.load(CHAT)
    sessions = SessionBuilder(sc, "salt").sessions()
    starts = {s.session_id: s.trace.start_s for s in sessions if s.trace is not None}
    assert planned.height == 4 * 18
    for block in range(4):
        rows = planned.filter(pl.col("block") == block).sort("trace_line")
        assert rows["trace_line"].to_list() == list(range(1, 19))
        assert rows["completion_tokens"].to_list() == [200] * 18
        first = rows.filter(pl.col("turn") == 1)
        assert first["arrival_s"].to_list() == [starts[s] for s in first["session_id"]]
        later = rows.filter(pl.col("turn") > 1)
        assert (later["trace_shared_blocks"] >= 5).all()
        assert (later["think_s"] > 0).all()


def test_planned_placements_and_hits_follow_the_trace(planned: pl.DataFrame) -> None:
    alt = planned.filter(pl.col("placement") == "alternate")
    assert (alt["replica"] == (alt["turn"] - 1 + alt["session_index"]) % 2).all()
    fixed = planned.filter(pl.col("placement") == "fixed")
    assert (fixed["replica"] == fixed["session_index"] % 2).all()
    assert (planned.filter(pl.col("cache") == "off")["external_hit_tokens"] == 0).all()
    moved_on = alt.filter((pl.col("turn") == 2) & (pl.col("cache") == "on"))
    assert (moved_on["external_hit_tokens"] > 0).all()
    assert (fixed.filter(pl.col("turn") > 1)["local_hit_tokens"] >= 5 * 512).all()


def test_sessiongen_plan_takes_a_trace_scenario(tmp_path: Path) -> None:
    out = plan(
        CHAT,
        overrides=['design.blocks=["off","on"]', 'placement.policies=["alternate"]'],
        runs_dir=tmp_path,
        seeds=1,
        sensitivity=False,
    )
    whatif = pl.read_parquet(out / "whatif.parquet")
    assert whatif["placement"].to_list() == ["alternate"]
    assert (out / "report" / "report.md").is_file()


def _planned(sc: scenario.Scenario, tmp: Path, tokens: Tokens) -> tuple[pl.DataFrame, str]:
    run_dir = virtual_replay(sc, tmp / tokens, tokens=tokens)
    run = load_run(run_dir)
    columns = [
        "block",
        "trace_line",
        "warmup",
        "prompt_tokens",
        "local_hit_tokens",
        "external_hit_tokens",
        "replica",
        "ttft_s",
        "e2e_s",
    ]
    frame = pl.read_parquet(run_dir / "requests.parquet").select(columns)
    return frame.sort("block", "warmup", "trace_line"), run.manifest["target"]["prompts"]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["sessions.trace.file=single-requests.jsonl", "sessions.trace.placement_key=prefix"],
    ],
)
def test_prompts_from_hash_ids_plan_as_the_exact_prompts(
    tmp_path: Path, overrides: list[str]
) -> None:
    """The planner's shape mode makes a trace's prompts from its hash ids, untokenized;
    the engine sees the same lengths and shared blocks, so every figure agrees."""
    sc = scenario.load(CHAT, ['design.blocks=["off","on"]', *overrides])
    exact, exact_mode = _planned(sc, tmp_path, "exact")
    shaped, shaped_mode = _planned(sc, tmp_path, "shape")
    assert (exact_mode, shaped_mode) == ("exact", "shape")
    assert exact.height > 12
    assert shaped.equals(exact)


def test_block_ids_share_exactly_the_blocks_their_hash_ids_share() -> None:
    a = block_ids([7, 8, 9], 1200, 512)
    b = block_ids([7, 8, 10, 11], 1600, 512)
    c = block_ids([7, 8], 700, 512)
    assert len(a) == 1200 and len(b) == 1600 and len(c) == 700
    assert (a[:1024] == b[:1024]).all()
    assert (a[:700] == c).all()
    assert (a[1024:] != b[1024:1200]).mean() > 0.99
    assert (block_ids([3], 512, 512) != block_ids([4], 512, 512)).mean() > 0.99


def test_trace_prompt_compiled_equals_its_numpy_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    # the compiled trace_tokens writes block_ids' ids in one pass; both must be the bits
    if os.environ.get(compiled.ENV) == "python":
        pytest.skip("SESSIONGEN_ENGINE=python: the compiled engine was not chosen")
    if compiled.core() is None:
        pytest.fail(f"the compiled engine is {compiled._load()[1]}")
    rng = np.random.default_rng(5)
    after = np.array([11, 12, 13], dtype=np.uint32)
    cases = [([], 0), ([7], 1), ([7], 512), ([2**40 + 3, 9], 600), ([1, 2, 3], 1030)]
    for _ in range(50):
        n = int(rng.integers(1, 30))
        ids = [int(x) for x in rng.integers(0, 2**62, n, dtype=np.int64)]
        cases.append((ids, int(rng.integers((n - 1) * 512 + 1, n * 512 + 1))))
    for ids, length in cases:
        fast = trace_prompt(ids, length, 512, after)
        monkeypatch.setenv(compiled.ENV, "python")
        slow = trace_prompt(ids, length, 512, after)
        monkeypatch.delenv(compiled.ENV)
        assert fast.dtype == slow.dtype == np.uint64
        assert np.array_equal(fast, slow), (ids, length)
        assert np.array_equal(slow[:length], block_ids(ids, length, 512))
        assert np.array_equal(slow[length:], after)


def test_trace_keys_from_the_memo_equal_the_keys_of_the_ids() -> None:
    """Shape mode hashes each distinct trace block once (``PromptKeys.extend_trace``); the
    keys, running sum and tail must be those of extending by ``trace_prompt``'s ids, for
    every head tail length, block and chunk size, partial last block and text after it,
    and ids that recur at other positions or after other ids (the memo's key)."""
    if os.environ.get(compiled.ENV) == "python":
        pytest.skip("SESSIONGEN_ENGINE=python: the compiled engine was not chosen")
    if compiled.core() is None:
        pytest.fail(f"the compiled engine is {compiled._load()[1]}")
    rng = np.random.default_rng(11)
    compared = hits = 0
    for _ in range(120):
        size = int(rng.choice([4, 16, 32]))
        trace_block = size * int(rng.integers(1, 5))
        ahead = int(rng.integers(0, size))  # the head's tokens past its last whole block
        head_ids = rng.integers(0, 1000, int(rng.integers(0, 3)) * size + ahead, dtype=np.uint64)
        head = PromptKeys.of(head_ids, size, size * int(rng.integers(1, 4)))
        after = rng.integers(0, 1000, int(rng.integers(0, 2 * size)), dtype=np.uint64)
        memo = head.trace_memo(trace_block, after)
        assert memo is not None
        pool = [int(x) for x in rng.integers(0, 2**64 - 1, 5, dtype=np.uint64)] + [0, 1]
        for _ in range(8):
            n = int(rng.integers(0, 6))
            ids = np.array([pool[int(rng.integers(0, len(pool)))] for _ in range(n)], np.uint64)
            length = int(rng.integers((n - 1) * trace_block + 1, n * trace_block + 1)) if n else 0
            want = head.extend(trace_prompt(ids, length, trace_block, after))
            before = memo.stored
            got = head.extend_trace(memo, ids.tolist(), length)
            hits += memo.stored == before and length >= trace_block
            assert got.tokens == want.tokens
            assert np.array_equal(got.local.keys, want.local.keys)
            assert np.array_equal(got.pool.keys, want.pool.keys)
            answer = rng.integers(0, 1000, int(rng.integers(0, 3 * size)), dtype=np.uint64)
            assert np.array_equal(got.extend(answer).local.keys, want.extend(answer).local.keys)
            compared += 1
    assert compared == 960 and hits > 40  # prompts wholly read from the memo


def test_shape_mode_uses_the_memo_and_plans_as_the_ids_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same trace planned in shape mode with the memo and without it (its prompts
    extended by ids): the same records."""
    if compiled.core() is None or os.environ.get(compiled.ENV) == "python":
        pytest.skip("the memo needs the compiled engine")
    sc = scenario.load(CHAT, ['design.blocks=["on"]'])
    calls = []
    extend_trace = PromptKeys.extend_trace

    def counted(self: PromptKeys, *args: Any) -> PromptKeys:
        calls.append(args[2])  # the prompt length
        return extend_trace(self, *args)

    monkeypatch.setattr(PromptKeys, "extend_trace", counted)
    with_memo, _ = _planned(sc, tmp_path / "memo", "shape")
    monkeypatch.setattr(PromptKeys, "trace_memo", lambda self, trace_block, after: None)
    without, _ = _planned(sc, tmp_path / "ids", "shape")
    assert with_memo.height > 12 and len(calls) >= with_memo.filter(~pl.col("warmup")).height
    assert with_memo.equals(without)


def test_a_trace_memo_serves_only_its_chain_and_keeps_no_more_than_its_limit() -> None:
    if compiled.core() is None or os.environ.get(compiled.ENV) == "python":
        pytest.skip("the memo needs the compiled engine")
    after = np.array([7, 8, 9], dtype=np.uint64)
    head = PromptKeys.of(np.arange(20, dtype=np.uint64), 16, 32)
    other = PromptKeys.of(np.arange(1, 21, dtype=np.uint64), 16, 32)
    memo = head.trace_memo(64, after)
    with pytest.raises(ValueError, match="another chain"):
        other.extend_trace(memo, [1, 2], 100)
    # a chain still pending (extended, not hashed) is hashed first, then checked
    pending = head.local.extend(np.arange(3, dtype=np.uint64))
    with pytest.raises(ValueError, match="another chain"):
        pending.extend_trace(memo, [1, 2], 100)
    # a memo with room for one trace block (its terms and entry) keeps one, keys still right
    small = compiled.core().TraceKeys(  # type: ignore[union-attr]
        np.arange(16, 20, dtype=np.uint64), after, _weights(16),
        *memo.chain[:2], _R_INV, 64, limit=4 + 9,
    )  # fmt: skip
    for ids in ([1, 2, 3], [4, 5, 6], [1, 2, 3]):
        got = head.extend_trace(small, ids, 180)
        assert np.array_equal(
            got.local.keys, head.extend(trace_prompt(ids, 180, 64, after)).local.keys
        )
    assert small.stored == 1
