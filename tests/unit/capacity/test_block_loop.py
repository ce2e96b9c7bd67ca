"""The planner's block loop runs the engine up to its own next start or event in one
call, settling at the first finish (``Cluster.advance(settle=True)``); the records must
be those of running it one engine time a call, on both engines."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.virtual import Tokens, virtual_replay
from sessiongen.sim import compiled
from sessiongen.sim.virtual import RequestResult, VirtualDriver
from tests.support.paths import ROOT

#: run_id differs from run to run, and the digest is salted by it
_PER_RUN = ["run_id", "prompt_digest"]


@pytest.mark.parametrize("engine", ["python", "compiled"])
@pytest.mark.parametrize(
    ("name", "tokens"),
    [
        ("scenarios/traces/chat-sessions.toml", "auto"),  # closed-loop turns, delays
        ("scenarios/pressure32k.toml", "shape"),  # evictions, warm-ups, many in flight
        ("scenarios/router128k.toml", "shape"),  # routed: finishes feed the router
    ],
)
def test_settled_advances_plan_as_one_engine_time_a_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, tokens: Tokens, engine: str
) -> None:
    if engine == "compiled" and compiled.core() is None:
        pytest.fail(f"the compiled engine is {compiled._load()[1]}")
    monkeypatch.setenv(compiled.ENV, engine)
    sc = scenario.load(ROOT / name)
    run = VirtualDriver.run
    calls = {"settled": 0, "stepped": 0}

    def counted(
        self: VirtualDriver, until: float = math.inf, *, settle: bool = False
    ) -> list[RequestResult]:
        calls["settled" if settle else "stepped"] += 1
        return run(self, until, settle=settle)

    def stepped(
        self: VirtualDriver, until: float = math.inf, *, settle: bool = False
    ) -> list[RequestResult]:
        # the loop's former call: every event at the engine's next time, nothing more
        calls["stepped"] += 1
        next_t = self.cluster.next_time()
        return run(self, until if not settle or next_t is None else next_t)

    monkeypatch.setattr(VirtualDriver, "run", counted)
    settled = pl.read_parquet(
        virtual_replay(sc, tmp_path / "a", tokens=tokens) / "requests.parquet"
    )
    monkeypatch.setattr(VirtualDriver, "run", stepped)
    one_by_one = pl.read_parquet(
        virtual_replay(sc, tmp_path / "b", tokens=tokens) / "requests.parquet"
    )
    assert settled.height > 100
    assert settled.drop(_PER_RUN).equals(one_by_one.drop(_PER_RUN))
    # the settled loop did make fewer calls, or there was nothing to compare
    assert 0 < calls["settled"] < calls["stepped"]
