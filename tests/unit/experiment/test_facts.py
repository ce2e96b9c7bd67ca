"""experiment.facts: every field of a turn's facts comes from where its name says."""

from __future__ import annotations

from types import SimpleNamespace

from sessiongen.experiment.facts import Placed, TurnFacts, warmup_placed
from sessiongen.workload.reuse import PrefixFacts


def test_turn_facts_take_each_field_from_its_source() -> None:
    asked = SimpleNamespace(
        session_id="s-1",
        session_index=1,
        context_tokens=2,
        turn=3,
        content_tokens=4,
        expected="needle",
        trace_line=5,
        prefix=PrefixFacts(6, 7, 8),
    )
    placed = Placed(cross_replica=True, queue_s=9.0, arrival_s=10.0, think_s=11.0)
    facts = TurnFacts.of(asked, placed, replica=12, warmup=False, prompt_digest="digest")
    assert facts._asdict() == {
        "session_id": "s-1",
        "session_index": 1,
        "context_tokens": 2,
        "turn": 3,
        "content_tokens": 4,
        "expected": "needle",
        "prompt_digest": "digest",
        "trace_line": 5,
        "trace_shared_blocks": 6,
        "trace_shared_tokens": 7,
        "trace_reuse_distance": 8,
        "replica": 12,
        "warmup": False,
        "cross_replica": True,
        "queue_s": 9.0,
        "arrival_s": 10.0,
        "think_s": 11.0,
    }


def test_a_turn_without_prefix_facts_has_none_and_a_warmup_is_placed_alone() -> None:
    asked = SimpleNamespace(
        session_id="w",
        session_index=0,
        context_tokens=0,
        turn=1,
        content_tokens=9,
        expected=None,
        trace_line=None,
        prefix=None,
    )
    facts = TurnFacts.of(asked, warmup_placed(1), replica=0, warmup=True, prompt_digest=None)
    assert (facts.trace_shared_blocks, facts.trace_shared_tokens) == (None, None)
    assert facts.trace_reuse_distance is None
    assert (facts.cross_replica, facts.queue_s, facts.arrival_s, facts.think_s) == (
        True,
        0.0,
        None,
        None,
    )
