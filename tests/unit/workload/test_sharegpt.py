"""The ShareGPT-shaped conversation reader: layouts, roles, merging, one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiongen.errors import ScenarioError
from sessiongen.workload.sharegpt import ChatExchange, read_conversations


def turn(side: str, text: Any) -> dict[str, Any]:
    return {"from": side, "value": text}


def conv(*turns: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**kw, "conversations": list(turns)}


def write_json(path: Path, rows: Any) -> Path:
    path.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else orjson.dumps(r).decode() for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ScenarioError) as info:
        list(read_conversations(path))
    return str(info.value)


def test_a_json_list_gives_questions_with_their_answers(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "d.json",
        [
            conv(turn("human", "q1"), turn("gpt", "a1"), turn("human", "q2"), id="x"),
            conv(turn("user", "only"), id=7),
        ],
    )
    first, second = read_conversations(path)
    assert (first.where, first.conv_id, first.system) == ("[0]", "x", None)
    assert first.exchanges == (ChatExchange("q1", "a1"), ChatExchange("q2", None))
    assert (second.where, second.conv_id) == ("[1]", "7")
    assert second.exchanges == (ChatExchange("only", None),)


def test_jsonl_is_one_conversation_a_line_and_skips_blank_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [conv(turn("human", "a")), "", conv(turn("human", "b"), turn("gpt", "c"))],
    )
    got = list(read_conversations(path))
    assert [c.where for c in got] == ["line 1", "line 3"]
    assert got[1].exchanges == (ChatExchange("b", "c"),)


def test_roles_system_leading_answers_and_runs_of_one_side(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "d.json",
        [
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "system", "content": "be kind"},
                    {"role": "assistant", "content": "hello, how can I help?"},
                    {"role": "user", "content": "part one"},
                    {"role": "user", "content": "part two"},
                    {"role": "assistant", "content": "x"},
                    {"role": "ChatGPT", "content": "y"},
                ]
            }
        ],
    )
    (c,) = read_conversations(path)
    assert c.system == "be brief\n\nbe kind"
    assert c.exchanges == (ChatExchange("part one\n\npart two", "x\n\ny"),)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([{"conversations": "hi"}], '[0]: conversations: expected a list of turns, got "hi"'),
        ([{"id": "a"}], "[0]: conversations: missing"),
        ([conv({"value": "q"})], "[0]: conversations[0].from: missing"),
        ([conv({"from": "human"})], "[0]: conversations[0].value: missing"),
        ([conv(turn("human", 3))], "[0]: conversations[0].value: expected a string, got 3"),
        ([conv(turn("robot", "q"))], "[0]: conversations[0].from: expected human, user, gpt"),
        ([conv(turn("gpt", "a"))], "[0]: conversations: no human turn"),
        ([conv()], "[0]: conversations: no human turn"),
        ([conv(turn("human", "q"), turn("system", "s"))], "[0]: conversations[1].from: a system"),
        ([conv(turn("human", "q")), "text"], '[1]: expected a JSON object, got "text"'),
        ([conv(turn("human", "q"), id=[1])], "[0]: id: expected a string or integer"),
        ([conv(turn("human", "q"), id="a")] * 2, '[1]: id: "a" is also the id at [0]'),
        ([conv(["human", "q"])], "[0]: conversations[0]: expected an object with from and value"),
        ([], "the dataset is empty (no conversations)"),
        ({"conversations": []}, "line 1: not JSON: unexpected end of data (JSONL holds one"),
    ],
)
def test_bad_json_names_the_conversation_and_the_field(
    tmp_path: Path, rows: Any, expected: str
) -> None:
    path = write_json(tmp_path / "d.json", rows)
    message = error_of(path)
    assert message.startswith(f"{path}: "), message
    assert expected in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([orjson.dumps(conv(turn("human", "q"))).decode(), "{oops"], "line 2: not JSON"),
        (["", '{"conversations": [{"from": "gpt", "value": "a"}]}'], "line 2: conversations: no"),
        (["[1]"], "[0]: expected a JSON object"),
        (["42"], "line 1: expected a JSON object, got 42"),
        (["", "  "], "the dataset is empty"),
    ],
)
def test_bad_jsonl_names_the_line_and_the_field(
    tmp_path: Path, lines: list[str], expected: str
) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", lines)
    message = error_of(path)
    assert message.startswith(f"{path}: ") and expected in message, message


def test_malformed_json_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[\n  {"conversations": []},\n  {"conversations": [}\n]\n')
    assert ": line 3: not JSON" in error_of(path)


def test_a_missing_file_or_a_folder_is_one_line(tmp_path: Path) -> None:
    assert error_of(tmp_path / "none.json").endswith("none.json: no such file")
    assert "is a folder" in error_of(tmp_path)


def test_conversations_are_checked_only_as_far_as_they_are_read(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [conv(turn("human", "q")), "{broken"])
    first = next(read_conversations(path))
    assert first.exchanges == (ChatExchange("q", None),)
