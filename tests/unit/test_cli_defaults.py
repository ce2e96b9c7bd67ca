"""Defaults the CLI states itself (so its start-up imports no analysis) against the
library's."""

from __future__ import annotations

from sessiongen.analysis.payoff import DEFAULT_PAYS_AT
from sessiongen.cli import cli
from sessiongen.cli.common import PAYS_AT


def test_pays_at_defaults_to_the_librarys_threshold_in_replay_and_plan() -> None:
    assert PAYS_AT == DEFAULT_PAYS_AT
    for command in ("replay", "plan"):
        params = cli.commands[command].params
        assert next(p.default for p in params if "--pays-at" in p.opts) == DEFAULT_PAYS_AT
