"""A shipped conversation dataset replayed on the embedded simulated pair: the requests
carry the dataset's text, their token counts are exact, later turns hit the cache; a
padded first turn is exactly its size; a bad dataset is one line, exit 2, no run folder.

Every assertion is on counted values (tokens, digests, hit tokens), never on timings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.analysis import load_run, session_speedup, session_totals
from sessiongen.capacity.virtual import Tokens, virtual_replay
from sessiongen.cli import main
from sessiongen.sim.prompt import MESSAGE_END, ROLE_HEAD
from sessiongen.text.tokenize import cl100k
from sessiongen.workload.sessions import SessionBuilder
from tests.support.paths import ROOT

SMALL = ROOT / "scenarios/conversations/sharegpt-small.toml"
DATASET: list[dict[str, Any]] = orjson.loads((SMALL.parent / "sharegpt-small.json").read_bytes())
FAST = ["target.sim.time_scale=0.02", 'design.blocks=["off","on"]']

Ran = tuple[pl.DataFrame, dict[str, Any], scenario.Scenario, Path]


def count(text: str) -> int:
    return cl100k().count_batch([text])[0]


def run(runs: Path, *overrides: str) -> Ran:
    sc = scenario.load(SMALL, [*FAST, *overrides])
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    return df, json.loads((out.run_dir / "manifest.json").read_text()), sc, out.run_dir


def template_tokens(roles: list[str]) -> int:
    """What the simulated pair's chat template adds around the messages' contents."""
    heads = sum(count(ROLE_HEAD.format(role=r)) + count(MESSAGE_END) for r in roles)
    return heads + count(ROLE_HEAD.format(role="assistant"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run(tmp_path_factory.mktemp("runs"), 'placement.policies=["fixed"]')


def test_every_turn_is_replayed_with_the_datasets_text(plain: Ran) -> None:
    df, manifest, sc, _ = plain
    kept = [
        c for c in DATASET if sum(t["from"] in ("human", "user") for t in c["conversations"]) >= 2
    ]
    assert set(df["session_id"]) == {c["id"] for c in kept}
    for block in manifest["blocks"]:
        rows = df.filter(pl.col("block") == block["block"]).sort("session_index", "turn")
        builder = SessionBuilder(sc, block["salt"])
        sent = {(s.session_id, r.turn): r for s in builder.sessions() for r in s.requests()}
        assert len(rows) == len(sent) == 12
        for row in rows.iter_rows(named=True):
            req = sent[(row["session_id"], row["turn"])]
            assert row["prompt_digest"] == req.prompt_digest()
            conv = next(c for c in kept if c["id"] == row["session_id"])
            body = orjson.dumps(req.body(sc)).decode()
            asked = [t["value"] for t in conv["conversations"] if t["from"] in ("human", "user")]
            for question in asked[: row["turn"]]:
                assert orjson.dumps(question).decode()[1:-1] in body


def test_token_counts_are_exact_under_the_tokenizer(plain: Ran) -> None:
    df, manifest, sc, _ = plain
    builder = SessionBuilder(sc, manifest["blocks"][0]["salt"])
    for session in builder.sessions():
        for req in session.requests():
            row = df.filter(
                (pl.col("block") == 0)
                & (pl.col("session_id") == req.session_id)
                & (pl.col("turn") == req.turn)
            ).row(0, named=True)
            contents = sum(count(text) for _role, text in req.messages)
            assert row["content_tokens"] == contents
            roles = [role for role, _text in req.messages]
            assert row["prompt_tokens"] == contents + template_tokens(roles)
            assert row["completion_tokens"] == req.max_tokens


def test_later_turns_reuse_the_earlier_prompt_on_their_replica(plain: Ran) -> None:
    df, _, _, _ = plain
    later = df.filter(pl.col("turn") > 1)
    assert later.height == 14
    assert (later["local_hit_tokens"] > 0).all()


def test_a_padded_first_turn_is_exactly_its_size_and_later_turns_extend_it(
    tmp_path: Path,
) -> None:
    df, _, _, _ = run(
        tmp_path,
        "sessions.sharegpt.pad_first_to=2048",
        "sessions.sharegpt.limit=2",
        'placement.policies=["fixed"]',
        'design.blocks=["on"]',
        'design.cache=["on"]',
    )
    first = df.filter(pl.col("turn") == 1)
    assert first["content_tokens"].to_list() == [2048, 2048]
    assert set(first["context_tokens"]) == {2048}
    later = df.filter(pl.col("turn") > 1)
    # The padded prompt is on the replica: turn 2 hits at least its whole blocks.
    assert (later["local_hit_tokens"] >= 2048 - 64).all()


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        ('[{"conversations": [{"from": "gpt", "value": "a"}]}]', "[0]: conversations: no human"),
        ('{"conversations": [{"from": "human", "value": 1}]}\n', "line 1: conversations[0].value"),
        ('{"conversations": [{"from": "human", "value": "q"}]}\n{oops\n', "line 2: not JSON"),
    ],
)
def test_a_bad_dataset_is_one_line_exit_2_and_no_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, expected: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(dataset)
    runs = tmp_path / "runs"
    args = ["replay", str(SMALL), "--runs-dir", str(runs), "--set"]
    with pytest.raises(SystemExit) as stop:
        main([*args, f"sessions.sharegpt.file={path}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert f"{path}: " in err and expected in err, err
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("tokens", ["exact", "shape"])
def test_the_plan_sends_the_same_turns_as_the_replay(
    plain: Ran, tmp_path: Path, tokens: Tokens
) -> None:
    """Shape mode too: a dataset's sessions are never shapes of one another."""
    df, _, sc, _ = plain
    planned = pl.read_parquet(virtual_replay(sc, tmp_path, tokens=tokens) / "requests.parquet")
    planned = planned.filter(~pl.col("warmup"))
    cols = ["block", "session_id", "turn", "prompt_tokens", "content_tokens", "completion_tokens"]
    assert planned.select(cols).sort(cols).equals(df.select(cols).sort(cols))
    assert (planned.filter(pl.col("turn") > 1)["local_hit_tokens"] > 0).all()


def test_sessions_of_their_own_lengths_are_complete_and_have_a_session_gain(plain: Ran) -> None:
    run = load_run(plain[3])
    totals = session_totals(run)
    assert totals.height == 10 and totals["complete"].all()
    gains = session_speedup(run)
    assert gains.height == 1 and gains["speedup"].is_not_null().all()
