"""The planner's fast paths change no result: every shipped scenario the planner accepts,
planned in shape and in exact mode, gives the same records as a slow reference path.

The fast paths share memory: a session's turns append their block keys to one buffer
(a prompt to the turn it extends, the answer to the prompt), the KV cache's runs are
views into requests' key arrays until they are released. The reference gives every
request fresh copies of its keys, so no two requests share a buffer and no run is a
view of anybody else's: a fast path that overwrote keys another request still reads,
or freed a run's keys too early, would change some hit and some time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.virtual import Tokens, check_plannable, plan_run
from sessiongen.errors import SessiongenError
from sessiongen.sim import compiled, scheduler
from sessiongen.sim import virtual as sim_virtual
from tests.support.paths import SCENARIOS


def _plannable() -> list[Path]:
    out = []
    for path in sorted(SCENARIOS.glob("**/*.toml")):
        try:
            check_plannable(scenario.load(path, _small(path)))
        except SessiongenError:
            continue
        out.append(path)
    return out


def _small(path: Path) -> list[str]:
    """Two sessions where the scenario has a count (a trace or dataset has its own)."""
    try:
        scenario.load(path, ["sessions.count=2"])
    except SessiongenError:
        return []
    return ["sessions.count=2"]


class _CopiedRequest(scheduler.SimRequest):
    """A request that owns fresh copies of its keys (the reference path)."""

    __slots__ = ()

    def __init__(self, *, keys: Any, pool_keys: Any, **kwargs: Any) -> None:
        super().__init__(keys=np.array(keys, copy=True), pool_keys=list(pool_keys), **kwargs)


def _records(path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch) -> pl.DataFrame:
    monkeypatch.setattr(os, "urandom", lambda n: b"\x07" * n)  # the planner's salt
    # The reference replaces the Python engine's requests; the compiled engine is held to
    # the Python one by tests/unit/sim/test_engines.py.
    monkeypatch.setenv(compiled.ENV, "python")
    sc = scenario.load(path, _small(path))
    return plan_run(sc, run_id="paths", tokens=tokens).requests


PLANNABLE = _plannable()


def test_most_shipped_scenarios_are_plannable() -> None:
    assert len(PLANNABLE) >= 15  # a loader change that skipped them all would pass below


@pytest.mark.parametrize("tokens", ["shape", "exact"])
@pytest.mark.parametrize("path", PLANNABLE, ids=lambda p: p.stem)
def test_fast_paths_plan_what_fresh_copies_plan(
    path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _records(path, tokens, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(sim_virtual, "SimRequest", _CopiedRequest)
        slow = _records(path, tokens, m)
    assert fast.height > 0
    assert fast.equals(slow), f"{path.name} ({tokens}) planned differently"
