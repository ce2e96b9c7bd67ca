"""``[sessions] source = "trace"`` and ``[sessions.trace]``: validated at load, read when the
sessions are built."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError
from sessiongen.workload.sessions import SessionBuilder
from sessiongen.workload.trace import read_trace

ROOT = Path(__file__).resolve().parents[3]


def load(tmp_path: Path, body: str, overrides: tuple[str, ...] = ()) -> scenario.Scenario:
    path = tmp_path / "tr.toml"
    path.write_text('name = "tr"\n' + body, encoding="utf-8")
    return scenario.load(path, overrides)


def test_trace_settings_load_and_find_the_file_beside_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n',
        encoding="utf-8",
    )
    sc = load(
        tmp_path,
        '[sessions]\nsource = "trace"\n[sessions.trace]\nfile = "t.jsonl"\n'
        "block_tokens = 16\nspeedup = 2\nlimit = 5\nwindow_ms = [100, 900]\n",
    )
    tr = sc.sessions.trace
    assert (tr.block_tokens, tr.speedup, tr.limit, tr.window()) == (16, 2.0, 5, (100.0, 900.0))
    assert tr.path(sc.source) == tmp_path / "t.jsonl"
    one = '[sessions]\nsource = "trace"\n[sessions.trace]\nfile = "t.jsonl"\nwindow_ms = 60000\n'
    assert load(tmp_path, one).sessions.trace.window() == 60000
    assert scenario.from_dict({"name": "x"}).sessions.trace.window() is None
    got = list(read_trace(tr.path(sc.source), block_tokens=tr.block_tokens, window=(0.0, 1.0)))
    assert [r.line for r in got] == [1]


def test_trace_settings_count_in_the_digest_when_used() -> None:
    # A bare scenario: smoke.toml's synthetic keys (count, turns, ...) do not apply to a
    # trace and are refused with source = "trace" (test_inapplicable_keys.py).
    base = scenario.from_dict({"name": "x"})
    assert (
        base.digest()
        == scenario.from_dict({"name": "x"}, overrides=["sessions.source=synthetic"]).digest()
    )
    traced = scenario.from_dict(
        {"name": "x"}, overrides=["sessions.source=trace", "sessions.trace.file=t.jsonl"]
    )
    assert base.digest() != traced.digest()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ('[sessions]\nsource = "trace"\n', "sessions.trace.file: missing; expected a trace file"),
        ('[sessions]\nsource = "replayed"\n', "sessions.source: expected"),
        (
            "[sessions.trace]\nwindow_ms = [1, 2, 3]\n",
            "sessions.trace.window_ms: expected a length",
        ),
        ("[sessions.trace]\nwindow_ms = [900, 100]\n", "sessions.trace.window_ms[1]: expected"),
        ("[sessions.trace]\nwindow_ms = 0\n", "sessions.trace.window_ms: expected a length > 0"),
        ("[sessions.trace]\nspeedup = 0\n", "sessions.trace.speedup: expected"),
        ("[sessions.trace]\nblock_tokens = 0\n", "sessions.trace.block_tokens: expected"),
        ("[sessions.trace]\npath = 'x'\n", "sessions.trace.path: unknown key"),
    ],
)
def test_bad_trace_settings_are_one_line_errors(tmp_path: Path, body: str, where: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load(tmp_path, body)
    assert str(info.value).startswith(f"{tmp_path / 'tr.toml'}: {where}"), str(info.value)


def test_the_builder_reads_the_trace_and_names_a_missing_file(tmp_path: Path) -> None:
    sc = load(tmp_path, '[sessions]\nsource = "trace"\n[sessions.trace]\nfile = "t.jsonl"\n')
    with pytest.raises(ScenarioError, match=r"t\.jsonl: no such file"):
        SessionBuilder(sc, "salt")
