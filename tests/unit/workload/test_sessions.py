"""The session builder: token-exact, deterministic, unique heads, frozen history, needles."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessiongen import scenario
from sessiongen.text import probes
from sessiongen.text.tokenize import cl100k
from sessiongen.workload import sessions

ENC = cl100k()


def make(**sessions_kw: Any) -> scenario.Scenario:
    raw: dict[str, Any] = {"name": "t", "seed": sessions_kw.pop("seed", 0), "sessions": sessions_kw}
    return scenario.from_dict(raw)


def count(text: str) -> int:
    return len(ENC.encode(text))


def content_count(req: sessions.TurnRequest) -> int:
    return sum(count(content) for _role, content in req.messages)


FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(
    ctx=st.integers(min_value=64, max_value=6000),
    q=st.integers(min_value=12, max_value=120),
    a=st.integers(min_value=1, max_value=300),
    seed=st.integers(min_value=0, max_value=2**31),
    history=st.sampled_from(["frozen", "none"]),
)
def test_every_turn_is_token_exact(ctx: int, q: int, a: int, seed: int, history: str) -> None:
    sc = make(
        count=1,
        turns=3,
        initial_context_tokens=ctx,
        question_tokens=q,
        answer_tokens=a,
        history=history,
        seed=seed,
    )
    (session,) = sessions.SessionBuilder(sc, "salt").sessions()
    for req in session.requests():
        assert req.content_tokens == content_count(req)
    first = session.request(1)
    context = first.messages[0][1]
    question = sessions.SessionBuilder(sc, "salt").build_parts(session)["questions"][0]
    assert context.endswith(question)
    assert count(context[: -len(question)]) == ctx
    assert count(question) == q


@FAST
@given(ctx=st.integers(min_value=200, max_value=4000), seed=st.integers(0, 2**20))
def test_needles_are_exact_and_answerable(ctx: int, seed: int) -> None:
    sc = make(count=1, turns=4, initial_context_tokens=ctx, probe="needle", seed=seed)
    (session,) = sessions.SessionBuilder(sc, "s").sessions()
    answers = set()
    for req in session.requests():
        assert req.content_tokens == content_count(req)
        assert req.expected is not None and req.expected.isdigit()
        text = "".join(content for _r, content in req.messages)
        assert probes.answer_needle(text) == req.expected
        answers.add(req.expected)
    assert len(answers) >= 2


def test_needles_spread_over_depths() -> None:
    sc = make(count=1, turns=6, initial_context_tokens=20000, probe="needle")
    (session,) = sessions.SessionBuilder(sc, "s").sessions()
    context = session.request(1).messages[0][1]
    positions = sorted(
        context.index(f"is {req.expected}.") / len(context) for req in session.requests()
    )
    assert positions[0] < 0.2 and positions[-1] > 0.8
    gaps = [b - a for a, b in itertools.pairwise(positions)]
    assert min(gaps) > 0.08


def test_deterministic_and_salt_only_changes_the_marker() -> None:
    sc = make(count=2, turns=2, initial_context_tokens=3000)
    one = [r.body(sc) for s in sessions.SessionBuilder(sc, "a").sessions() for r in s.requests()]
    again = [r.body(sc) for s in sessions.SessionBuilder(sc, "a").sessions() for r in s.requests()]
    other = [r.body(sc) for s in sessions.SessionBuilder(sc, "b").sessions() for r in s.requests()]
    assert one == again
    assert one != other
    head_a = one[0]["messages"][0]["content"]
    head_b = other[0]["messages"][0]["content"]
    cut = head_a.index(".") + 1
    assert head_a.startswith("Ref ") and head_a[:cut] != head_b[:cut]
    assert head_a[cut:] == head_b[head_b.index(".") + 1 :]


@FAST
@given(salt=st.text(min_size=1, max_size=12), n=st.integers(2, 6))
def test_session_heads_are_unique(salt: str, n: int) -> None:
    sc = make(count=n, turns=1, initial_context_tokens=256)
    heads = [
        tuple(ENC.encode(s.request(1).messages[0][1])[:8])
        for s in sessions.SessionBuilder(sc, salt).sessions()
    ]
    assert len(set(heads)) == n


def test_frozen_history_extends_the_previous_turn() -> None:
    sc = make(count=1, turns=4, initial_context_tokens=1500, question_tokens=40, answer_tokens=90)
    (session,) = sessions.SessionBuilder(sc, "x").sessions()
    reqs = list(session.requests())
    for prev, nxt in itertools.pairwise(reqs):
        assert nxt.messages[: len(prev.messages)] == prev.messages
        assert [r for r, _ in nxt.messages[len(prev.messages) :]] == ["assistant", "user"]
        assert nxt.content_tokens - prev.content_tokens == 130


def test_live_history_uses_given_answers() -> None:
    sc = make(count=1, turns=2, initial_context_tokens=500, history="live")
    (session,) = sessions.SessionBuilder(sc, "x").sessions()
    req = session.request(2, ["forty two"])
    assert req.messages[1] == ("assistant", "forty two")
    assert req.content_tokens == content_count(req)
    with pytest.raises(ValueError, match="needs 1 answers"):
        session.request(2, [])


def test_shared_system_prompt_is_shared_and_exact() -> None:
    sc = make(count=3, turns=1, initial_context_tokens=300, shared_prefix_tokens=200)
    reqs = [s.request(1) for s in sessions.SessionBuilder(sc, "x").sessions()]
    systems = {r.messages[0] for r in reqs}
    assert len(systems) == 1
    ((role, text),) = systems
    assert role == "system" and count(text) == 200
    assert all(r.content_tokens == content_count(r) for r in reqs)


def test_multiple_context_sizes_make_sessions_per_size() -> None:
    sc = make(count=2, turns=1, initial_context_tokens=[300, 600])
    got = [(s.session_id, s.context_tokens) for s in sessions.SessionBuilder(sc, "x").sessions()]
    assert [c for _, c in got] == [300, 300, 600, 600]
    assert len({sid for sid, _ in got}) == 4


def test_completions_body_is_the_concatenation() -> None:
    raw = {
        "name": "t",
        "model": {"api": "completions"},
        "sessions": {"count": 1, "turns": 2, "initial_context_tokens": 400},
    }
    sc = scenario.from_dict(raw)
    (session,) = sessions.SessionBuilder(sc, "x").sessions()
    req = session.request(2)
    body = req.body(sc)
    assert "messages" not in body and count(body["prompt"]) == req.content_tokens


def test_equivalence_probe_asks_for_logprobs() -> None:
    sc = make(count=1, turns=1, initial_context_tokens=300, probe="equivalence")
    body = sessions.SessionBuilder(sc, "x").sessions()[0].request(1).body(sc)
    assert body["logprobs"] is True and body["top_logprobs"] == 1
    assert body["stream_options"] == {"include_usage": True}


def test_too_small_context_for_needles_is_a_scenario_error() -> None:
    from sessiongen.errors import ScenarioError

    sc = make(count=1, turns=6, initial_context_tokens=40, probe="needle")
    with pytest.raises(ScenarioError, match=r"sessions\.initial_context_tokens"):
        sessions.SessionBuilder(sc, "x")


@FAST
@given(
    api=st.sampled_from(["chat", "completions"]),
    history=st.sampled_from(["frozen", "none", "live"]),
    probe=st.sampled_from(["none", "needle", "equivalence"]),
    shared=st.sampled_from([0, 120]),
    turn=st.integers(1, 3),
)
def test_body_parts_concatenate_to_the_serialized_body(
    api: str, history: str, probe: str, shared: int, turn: int
) -> None:
    import orjson

    raw = {
        "name": "t",
        "model": {"api": api},
        "sessions": {
            "count": 1,
            "turns": 3,
            "initial_context_tokens": 900,
            "history": history,
            "probe": probe,
            "shared_prefix_tokens": shared,
        },
    }
    sc = scenario.from_dict(raw)
    (session,) = sessions.SessionBuilder(sc, "x").sessions()
    answers = ['quoted "answer" \\ with\nnewline é'] * (turn - 1) if history == "live" else None
    req = session.request(turn, answers)
    parts = req.body_parts(sc)
    assert b"".join(parts) == orjson.dumps(req.body(sc))
    # The context travels as the session's own escaped bytes: referenced, never copied.
    context = session.texts()["context"].json
    kept = next(p for p in parts if p == context)
    assert any(kept is p for p in session.request(turn, answers).body_parts(sc))
