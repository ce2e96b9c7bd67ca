"""Scenario errors say each thing once and list every key a user may write
("got 'alternat', got ['alternat']"; the known keys of [sessions] lacked source)."""

from __future__ import annotations

import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"


def error(*overrides: str) -> str:
    with pytest.raises(ScenarioError) as info:
        scenario.load(SMOKE, list(overrides))
    return str(info.value)


def test_a_check_that_names_the_entry_is_not_followed_by_the_value_again() -> None:
    line = error('placement.policies=["fixed", "alternat"]')
    assert line.endswith("got 'alternat'") and line.count("got") == 1


def test_a_check_without_the_value_gets_it_once() -> None:
    line = error('model.tokenizer="gpt2"')
    assert line.count(", got ") == 1


def test_known_keys_of_sessions_name_source() -> None:
    line = error("sessions.sourc=1")
    assert "sessions.sourc: unknown key (known keys here: " in line
    assert ", source, " in line


def test_the_loaders_own_source_is_not_offered_at_the_top() -> None:
    line = error("foo=1")
    assert "source" not in line.split("known keys here:")[1]
