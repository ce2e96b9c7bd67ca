"""A ``[sessions]`` key the source of sessions ignores is refused at load, one line naming
it and what sets it instead (``--set sessions.count=50`` on a trace
used to change nothing, silently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError
from sessiongen.scenario.sourcekeys import IGNORED

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "scenarios" / "traces" / "chat-replay.toml"
SHAREGPT = ROOT / "scenarios" / "conversations" / "sharegpt-small.toml"
VALUES = {
    "count": "50",
    "turns": "3",
    "initial_context_tokens": "4096",
    "question_tokens": "80",
    "history": '"live"',
    "think_time_s": "2.0",
    "think": '"exponential"',
    "think_sigma": "1.0",
    "probe": '"needle"',
    "shared_prefix_tokens": "64",
}


def test_sessions_count_on_a_trace_is_refused_in_one_line() -> None:
    with pytest.raises(ScenarioError) as info:
        scenario.load(TRACE, ["sessions.count=50"])
    assert str(info.value) == (
        f"{TRACE}: sessions.count: does not apply to a trace source (the trace sets its "
        "sessions; sessions.trace.limit or window_ms selects them)"
    )


@pytest.mark.parametrize(
    ("path", "source", "key"),
    [(TRACE, "trace", k) for k in IGNORED["trace"]]
    + [(SHAREGPT, "sharegpt", k) for k in IGNORED["sharegpt"]],
)
def test_every_ignored_key_is_refused(path: Path, source: str, key: str) -> None:
    with pytest.raises(ScenarioError, match=f"sessions.{key}: does not apply to a {source}"):
        scenario.load(path, [f"sessions.{key}={VALUES[key]}"])


def test_keys_the_sources_read_still_load() -> None:
    assert scenario.load(TRACE, ["sessions.trace.speedup=4"]).sessions.trace.speedup == 4.0
    assert scenario.load(TRACE).sessions.answer_tokens == 16  # the warm-ups' max_tokens
    chat = scenario.load(SHAREGPT, ["sessions.think_time_s=2", 'sessions.history="live"'])
    assert (chat.sessions.think_time_s, chat.sessions.history) == (2.0, "live")
    assert scenario.load(ROOT / "scenarios" / "smoke.toml").sessions.count == 2


def test_the_other_sources_tables_are_refused() -> None:
    smoke = ROOT / "scenarios" / "smoke.toml"
    with pytest.raises(ScenarioError, match=r"sessions\.trace\.speedup: does not apply to a synth"):
        scenario.load(smoke, ["sessions.trace.speedup=4"])
    with pytest.raises(
        ScenarioError, match=r"sessions\.sharegpt\.limit: does not apply to a trace"
    ):
        scenario.load(TRACE, ["sessions.sharegpt.limit=4"])
