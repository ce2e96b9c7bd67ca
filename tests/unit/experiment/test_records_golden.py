"""A replay's and a plan's records stay what they were before the experiment was written
once: small shipped scenarios, replayed on the embedded simulated pair on the
modeled clock and planned on the virtual clock, give exactly the records saved in
``tests/fixtures/experiment/`` (made at the commit before the refactor).

Kept: every column a run decides, the modeled durations included (``server_ttft_s``,
``server_queue_s``, the planner's times, ``queue_s``, ``arrival_s`` and ``think_s`` on
the modeled clock). Dropped from a replay's records, as the wall clock or the machine
decides them: ``run_id`` is fixed instead, and :data:`WALL` are left out.

A served replay follows its stated arrivals only when the machine sends each request in
time: a request that comes in after its stated arrival (``arrival_late_s`` > 0, a busy
machine) is taken late, and the engine's figures (:data:`ENGINE`) of the rest of its
block change. The replay is then run again (up to :data:`ATTEMPTS` times); in blocks
still late, the engine's figures are left out and everything else is compared.

A served replay's modeled durations are differences of modeled times whose origin is the
engine's clock when the block starts (read over HTTP, so it varies from run to run):
they agree to :data:`ROUNDING` seconds, not to the bit (two runs at one commit differ by
about 1e-16 s). A plan's records agree to the bit.

One change was meant: a trace's records carried ``load_level = 4``, an unused default
(``driver.concurrency``); a trace has no level, so its fixtures say null
(:func:`sessiongen.design.load.load_levels`), and nothing else of them changed.

Regenerate (only on purpose, when a change of records is meant):
``python -m tests.unit.experiment.test_records_golden``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.virtual import Tokens, plan_run
from sessiongen.replay.orchestrator import ReplayOptions, replay
from tests.support.paths import FIXTURES, SCENARIOS

GOLDEN = FIXTURES / "experiment"

#: Columns the wall clock, the event loop or the machine decides in a served replay.
WALL = (
    "ttfb_s", "ttft_s", "e2e_s", "itl_p50_s", "itl_max_s", "send_s", "output_chunks",
    "loop_lag_flag", "arrival_late_s", "error",
)  # fmt: skip

#: What the engine decides of a served replay's request, and a late arrival changes.
ENGINE = (
    "server_ttft_s", "server_queue_s", "queue_s", "cached_tokens", "local_hit_tokens",
    "external_hit_tokens",
)  # fmt: skip

#: Runs of a served replay tried before its late blocks are excused.
ATTEMPTS = 3

#: How far a served replay's modeled durations may differ from the saved ones (seconds).
ROUNDING = 1e-12

#: The order records are compared in (a replay emits them as requests finish).
ORDER = ("block", "warmup", "session_index", "session_id", "turn", "replica")

REPLAYS: dict[str, tuple[str, list[str]]] = {
    "replay-smoke": (
        "smoke.toml",
        ["target.sim.time_scale=0.05", "driver.concurrency=2", "sessions.think_time_s=1"],
    ),
    "replay-trace": (
        "traces/chat-replay.toml",
        ['placement.policies=["alternate"]', "target.sim.time_scale=0.02"],
    ),
}
PLANS: dict[str, tuple[str, list[str], Tokens]] = {
    "plan-smoke": ("smoke.toml", ["driver.concurrency=2", 'sessions.history="live"'], "exact"),
    "plan-pressure-shape": (
        "pressure32k.toml",
        [
            "sessions.count=3",
            "sessions.turns=3",
            "sessions.initial_context_tokens=4096",
            "load.levels=[1, 3]",
            "target.sim.local_cache_tokens=9000",
            "target.sim.max_model_len=8192",
        ],
        "shape",
    ),
    "plan-trace": ("traces/chat-replay.toml", [], "shape"),
    "plan-trace-exact": ("traces/chat-replay.toml", ['placement.policies=["fixed"]'], "exact"),
    "plan-router": (
        "router128k.toml",
        [
            "sessions.count=2",
            "sessions.turns=3",
            "sessions.initial_context_tokens=4096",
            'placement.policies=["router:round_robin", "router:cache_aware"]',
        ],
        "exact",
    ),
    "plan-sharegpt": ("conversations/sharegpt-small.toml", [], "auto"),
}


def _fixed_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\x07" * n)


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    kept = frame.drop([c for c in WALL if c in frame.columns])
    return kept.sort(list(ORDER), nulls_last=True)


def replayed(name: str, tmp: Path) -> tuple[pl.DataFrame, set[int]]:
    """A served replay's records, and the blocks where a request arrived late."""
    path, sets = REPLAYS[name]
    sc = scenario.load(SCENARIOS / path, sets)
    opts = ReplayOptions(runs_dir=tmp, progress=False, run_id="golden")
    raw = pl.read_parquet(replay(sc, opts).run_dir / "requests.parquet")
    late = raw.filter(pl.col("arrival_late_s") > 0)["block"].unique().to_list()
    return _sorted(raw), set(late)


def planned(name: str) -> pl.DataFrame:
    path, sets, tokens = PLANS[name]
    sc = scenario.load(SCENARIOS / path, sets)
    return _sorted(plan_run(sc, run_id="golden", tokens=tokens).requests)


def _assert_same(
    name: str, got: pl.DataFrame, *, rounding: float = 0.0, excused: set[int] | None = None
) -> None:
    """``got`` is the saved fixture (floats within ``rounding``; the engine's figures of
    the ``excused`` blocks left out)."""
    want = pl.read_parquet(GOLDEN / f"{name}.parquet")
    assert got.height == want.height > 0, name
    assert got.columns == want.columns, name
    late = got["block"].is_in(sorted(excused or ()))
    for column in want.columns:
        diff = got[column].ne_missing(want[column])
        if rounding and want[column].dtype == pl.Float64:
            near = (got[column] - want[column]).abs() <= rounding
            diff = diff & ~near.fill_null(False)
        if column in ENGINE:
            diff = diff & ~late
        if diff.any():
            shown = ["block", "session_id", "turn", pl.col(column).cast(pl.String)]
            raise AssertionError(
                f"{name}: {column} differs in {diff.sum()} records\n"
                f"{got.filter(diff).select(shown).head(5)}\n{want.filter(diff).select(shown).head(5)}"
            )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_replay_records_are_unchanged(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fixed_salt(monkeypatch)
    got, late = replayed(name, tmp_path / "0")
    for attempt in range(1, ATTEMPTS):
        if not late:
            break
        got, late = replayed(name, tmp_path / str(attempt))
    _assert_same(name, got, rounding=ROUNDING, excused=late)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_planned_records_are_unchanged(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _fixed_salt(monkeypatch)
    _assert_same(name, planned(name))


def _write(only: list[str]) -> None:  # pragma: no cover - run by hand
    import tempfile

    os.urandom = lambda n: b"\x07" * n  # the fixed salt
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name in [*REPLAYS, *PLANS]:
        if only and name not in only:
            continue
        if name in REPLAYS:
            with tempfile.TemporaryDirectory() as tmp:
                frame, late = replayed(name, Path(tmp))
                assert not late, f"{name}: blocks {sorted(late)} arrived late; run it again"
        else:
            frame = planned(name)
        frame.write_parquet(GOLDEN / f"{name}.parquet")
        print(f"{name}: {frame.height} records")


if __name__ == "__main__":  # pragma: no cover
    _write(sys.argv[1:])
