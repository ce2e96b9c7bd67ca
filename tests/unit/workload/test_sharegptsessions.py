"""A conversation dataset as sessions: kept turns, exact counts, frozen answers, padding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError
from sessiongen.text.tokenize import cl100k
from sessiongen.workload.sessions import SessionBuilder, TurnRequest
from tests.support.paths import ROOT

SMALL = ROOT / "scenarios/conversations/sharegpt-small.toml"
DATASET = orjson.loads((SMALL.parent / "sharegpt-small.json").read_bytes())


def count(text: str) -> int:
    return cl100k().count_batch([text])[0]


def build(*overrides: str, salt: str = "s1") -> SessionBuilder:
    return SessionBuilder(scenario.load(SMALL, list(overrides)), salt)


def requests(builder: SessionBuilder) -> dict[str, list[TurnRequest]]:
    return {s.session_id: list(s.requests()) for s in builder.sessions()}


def questions_of(conv: dict[str, Any]) -> list[str]:
    return [t["value"] for t in conv["conversations"] if t["from"] in ("human", "user")]


def test_questions_and_frozen_answers_are_the_datasets_text() -> None:
    reqs = requests(build())
    garden = reqs["garden-01"]
    turns = DATASET[0]["conversations"]
    assert len(garden) == 3
    last = garden[2].messages
    assert [role for role, _ in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[0][1].endswith("\n\n" + turns[0]["value"])
    assert [text for _role, text in last[1:]] == [t["value"] for t in turns[1:5]]
    # The next turn's prompt is the previous one plus the frozen answer and the question.
    assert garden[1].messages == last[:3]


def test_counts_are_exact_and_max_tokens_is_the_answers_length() -> None:
    for reqs in requests(build()).values():
        for req in reqs:
            assert req.content_tokens == sum(count(text) for _role, text in req.messages)
    garden = requests(build())["garden-01"]
    answers = [t["value"] for t in DATASET[0]["conversations"] if t["from"] == "gpt"]
    assert [r.max_tokens for r in garden] == [count(a) for a in answers]


def test_an_unanswered_last_question_asks_for_the_scenarios_max_tokens() -> None:
    trip = requests(build())["trip-05"]
    assert trip[-1].messages[-1] == ("user", "Thank you, that helps.")
    assert trip[-1].max_tokens == 16
    fixed = requests(build("sessions.sharegpt.output_tokens=scenario"))["trip-05"]
    assert [r.max_tokens for r in fixed] == [16, 16, 16]


def test_min_turns_max_turns_and_limit_choose_the_sessions() -> None:
    assert [s.session_id for s in build().sessions()] == [
        "garden-01",
        "bread-02",
        "bike-04",
        "trip-05",
        "code-06",
    ]
    assert len(build("sessions.sharegpt.min_turns=1").sessions()) == 6
    three = build("sessions.sharegpt.min_turns=3")
    assert [s.session_id for s in three.sessions()] == ["garden-01", "trip-05"]
    capped = build("sessions.sharegpt.max_turns=2")
    assert {s.turns for s in capped.sessions()} == {2}
    assert [s.session_id for s in build("sessions.sharegpt.limit=2").sessions()] == [
        "garden-01",
        "bread-02",
    ]


def test_max_context_tokens_ends_a_session_at_the_first_turn_that_does_not_fit() -> None:
    full = requests(build())["garden-01"]
    need = [r.content_tokens + (r.max_tokens or 0) for r in full]
    cap = need[1]  # turn 2 fits exactly, turn 3 does not
    capped = requests(build(f"sessions.sharegpt.max_context_tokens={cap}"))
    assert len(capped["garden-01"]) == 2
    for reqs in capped.values():
        assert all(r.content_tokens + (r.max_tokens or 0) <= cap for r in reqs)


def test_nothing_kept_is_one_line_naming_the_dataset() -> None:
    with pytest.raises(ScenarioError) as info:
        build("sessions.sharegpt.min_turns=4", "sessions.sharegpt.max_turns=9")
    message = str(info.value)
    assert "sharegpt-small.json: sessions.sharegpt: no conversation has min_turns = 4" in message


def test_the_first_turn_is_padded_to_exactly_pad_first_to() -> None:
    reqs = requests(build("sessions.sharegpt.pad_first_to=3000"))
    for sid, turns in reqs.items():
        first = turns[0]
        assert first.content_tokens == 3000, sid
        assert sum(count(text) for _role, text in first.messages) == 3000, sid
        assert first.context_tokens == 3000
        for later in turns[1:]:  # later turns extend the padded first turn exactly
            assert later.messages[: len(first.messages)] == first.messages
            assert later.content_tokens == sum(count(text) for _role, text in later.messages)
    bread = reqs["bread-02"][0].messages
    assert bread[0][0] == "system" and bread[0][1].endswith(DATASET[1]["conversations"][0]["value"])
    assert bread[1][1].endswith("\n\n" + questions_of(DATASET[1])[0])


def test_padding_depends_on_the_seed_only_and_the_marker_on_the_salt() -> None:
    a = requests(build("sessions.sharegpt.pad_first_to=600", salt="a"))["garden-01"][0]
    b = requests(build("sessions.sharegpt.pad_first_to=600", salt="b"))["garden-01"][0]
    again = requests(build("sessions.sharegpt.pad_first_to=600", salt="a"))["garden-01"][0]
    assert a.messages == again.messages
    text_a, text_b = a.messages[0][1], b.messages[0][1]
    assert text_a != text_b
    assert text_a.split(".", 1)[1] == text_b.split(".", 1)[1]  # all after the marker


def test_completions_count_the_joined_prompt() -> None:
    builder = build("model.api=completions", "sessions.sharegpt.pad_first_to=500")
    for reqs in requests(builder).values():
        for req in reqs:
            assert req.content_tokens == count("".join(text for _role, text in req.messages))


def test_live_history_counts_the_real_answers() -> None:
    builder = build("sessions.history=live")
    session = builder.sessions()[0]
    req = session.request(2, ["a short real answer"])
    assert req.messages[1] == ("assistant", "a short real answer")
    assert req.content_tokens == sum(count(text) for _role, text in req.messages)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("sessions.history=none", "sessions.history: expected"),
        ("sessions.probe=needle", "sessions.probe: does not apply to a sharegpt source"),
        ("sessions.shared_prefix_tokens=64", "sessions.shared_prefix_tokens: does not apply"),
    ],
)
def test_what_a_dataset_replay_does_not_do_is_refused(override: str, field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        build(override)
    assert f": {field}" in str(info.value)


def test_a_turn_beyond_the_models_context_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ScenarioError) as info:
        build("target.sim.max_model_len=150")
    message = str(info.value)
    assert "turns need more than the model's max_model_len = 150 tokens" in message
    assert "max_context_tokens" in message


def test_a_dataset_without_a_file_is_refused_at_load(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text('name = "x"\n[sessions]\nsource = "sharegpt"\n')
    with pytest.raises(ScenarioError) as info:
        scenario.load(bad)
    assert "sessions.sharegpt.file: missing" in str(info.value)
