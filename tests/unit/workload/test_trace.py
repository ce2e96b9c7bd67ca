"""The Mooncake-style trace reader: fields, times, windows, streaming, one-line errors."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiongen.errors import ScenarioError
from sessiongen.workload.trace import TraceRequest, read_trace


def write(path: Path, rows: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else orjson.dumps(r).decode() for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def row(ts: float | None = 0, n: int = 1000, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"input_length": n, "output_length": 10}
    if ts is not None:
        out["timestamp"] = ts
    out["hash_ids"] = kw.pop("hash_ids", list(range(-(-n // 512))))
    out.update(kw)
    return out


def error_of(path: Path, **kw: Any) -> str:
    with pytest.raises(ScenarioError) as info:
        list(read_trace(path, **kw))
    return str(info.value)


def test_reads_fields_and_times_from_the_first_request(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            row(1000, 1025, hash_ids=[0, 1, 2]),
            row(1500, 512, hash_ids=[0], session_id=7),
            row(None, 700, hash_ids=[0, 3], session_id=7, delay=250),
            "",
            row(3000, 1, hash_ids=[9], extra="ignored"),
        ],
    )
    got = list(read_trace(path, speedup=2.0))
    assert got == [
        TraceRequest(1, 0.0, 1025, 10, (0, 1, 2), None, None),
        TraceRequest(2, 250.0, 512, 10, (0,), "7", None),
        TraceRequest(3, None, 700, 10, (0, 3), "7", 125.0),
        TraceRequest(5, 1000.0, 1, 10, (9,), None, None),
    ]


def test_block_size_decides_how_many_ids_a_prompt_has(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [row(0, 40, hash_ids=[1, 2, 3])])
    assert [r.hash_ids for r in read_trace(path, block_tokens=16)] == [(1, 2, 3)]
    msg = error_of(path)  # 512 tokens a block: one id expected
    assert msg.startswith(f"{path}: line 1: hash_ids: expected ceil(input_length / block_tokens)")
    assert "= 1 ids, got 3" in msg


def test_window_keeps_whole_sessions_by_their_first_turn(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            row(100, session_id="a"),
            row(150, session_id="b"),
            row(None, session_id="a", delay=5),
            row(400, session_id="c"),
            row(None, session_id="b", delay=5),
            row(900),
        ],
    )
    # length 100 ms from the first timestamp: a (100) and b (150), not c (400) or 900
    assert [r.line for r in read_trace(path, window=100.0)] == [1, 2, 3, 5]
    # (start, end) in trace ms, times then measured from the start
    got = list(read_trace(path, window=(150.0, 900.0)))
    assert [(r.line, r.timestamp_ms) for r in got] == [(2, 0.0), (4, 250.0), (5, None)]
    assert [r.line for r in read_trace(path, limit=2)] == [1, 2]
    assert "no request of the trace falls in" in error_of(path, window=(1000.0, 2000.0))


def test_reading_is_lazy(tmp_path: Path) -> None:
    # A broken line far down the file is not met until the reader gets there: nothing is
    # read ahead, so a million lines are never held at once.
    path = write(tmp_path / "t.jsonl", [row(i) for i in range(50)] + ["{broken"])
    first = list(itertools.islice(read_trace(path), 3))
    assert [r.line for r in first] == [1, 2, 3]
    assert error_of(path).startswith(f"{path}: line 51: not JSON")


@pytest.mark.parametrize(
    ("rows", "where"),
    [
        ([row(0), "{not json"], "line 2: not JSON"),
        ([row(0), "[1, 2]"], "line 2: expected a JSON object"),
        ([{"timestamp": 0, "output_length": 1, "hash_ids": [0]}], "line 1: input_length: missing"),
        ([row(0, output_length="12")], "line 1: output_length: expected an integer >= 1"),
        ([row(0, n=0, hash_ids=[])], "line 1: input_length: expected an integer >= 1"),
        ([row(0, hash_ids=[1, -2])], "line 1: hash_ids: expected a list of integers >= 0"),
        ([row(0, hash_ids=[1, True])], "line 1: hash_ids: expected a list of integers >= 0"),
        ([row(0, hash_ids="0")], "line 1: hash_ids: expected a list of integers >= 0"),
        ([row(0, n=1000, hash_ids=[1])], "line 1: hash_ids: expected ceil"),
        ([row(5), row(4)], "line 2: timestamp: expected >= 5 (line 1), got 4"),
        ([row(None)], "line 1: timestamp: missing (needed for a request without session_id"),
        ([row(None, session_id="s", delay=3)], "line 1: timestamp: missing (needed for a sess"),
        ([row(0, session_id="s", delay=3)], "line 1: delay: given for a request with no earlier"),
        ([row(0, session_id="s"), row(None, session_id="s", delay=-1)], "line 2: delay: expected"),
        ([row("soon")], "line 1: timestamp: expected milliseconds >= 0"),
        ([row(0, session_id=[1])], "line 1: session_id: expected a string or integer"),
    ],
)
def test_bad_lines_are_one_line_errors_naming_file_line_and_field(
    tmp_path: Path, rows: list[Any], where: str
) -> None:
    path = write(tmp_path / "t.jsonl", rows)
    msg = error_of(path)
    assert msg.startswith(f"{path}: {where}"), msg
    assert "\n" not in msg


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    assert error_of(empty) == f"{empty}: the trace is empty (no request lines)"
    missing = tmp_path / "nope.jsonl"
    assert error_of(missing) == f"{missing}: no such file"
    assert error_of(tmp_path) == f"{tmp_path}: is a folder, expected a trace file"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"block_tokens": 0}, "block_tokens"),
        ({"speedup": 0.0}, "speedup"),
        ({"limit": 0}, "limit"),
        ({"window": (5.0, 5.0)}, "window"),
        ({"window": -1.0}, "window"),
    ],
)
def test_bad_options(tmp_path: Path, kw: dict[str, Any], field: str) -> None:
    path = write(tmp_path / "t.jsonl", [row(0)])
    assert error_of(path, **kw).startswith(f"{path}: {field}: expected")
