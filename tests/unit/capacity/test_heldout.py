"""The held-out decision's comparison: planned against measured gains and verdicts."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from sessiongen.analysis.payoff import with_verdicts
from sessiongen.capacity import heldout, plan
from sessiongen.records.run import load_run
from tests.support.paths import ROOT


def side(
    gains: list[float], lows: list[float], highs: list[float], pays_at: float = 1.1
) -> pl.DataFrame:
    """What-if rows of three cells (alternate 12k at 1, 2, 4 in flight) with verdicts."""
    n = len(gains)
    rows = pl.DataFrame(
        {
            "placement": ["alternate"] * n,
            "context_tokens": [12000] * n,
            "load_level": [1.0, 2.0, 4.0][:n],
            "session_gain": gains,
            "session_gain_low": lows,
            "session_gain_high": highs,
            "later_gain": [2 * g for g in gains],
            "later_gain_low": [2 * g for g in lows],
            "later_gain_high": [2 * g for g in highs],
            "sessions": [6] * n,
        }
    )
    return with_verdicts(rows, pays_at)


def test_errors_are_planned_over_measured_and_verdicts_compared_where_decided() -> None:
    measured = side([1.5, 1.0, 1.12], [1.3, 0.9, 1.0], [1.7, 1.05, 1.3])
    planned = side([1.2, 1.3, 1.0], [1.15, 1.2, 0.9], [1.25, 1.4, 1.05])
    table = heldout.compare(planned, measured)
    assert table["session_gain_error"].round(6).to_list() == [-0.2, 0.3, round(1.0 / 1.12 - 1, 6)]
    assert (
        table["later_gain_error"].round(6).to_list()
        == table["session_gain_error"].round(6).to_list()
    )
    assert table["verdict_measured"].to_list() == ["pays", "does not pay", "undecided"]
    assert table["verdict_planned"].to_list() == ["pays", "pays", "does not pay"]
    assert table["agree"].to_list() == [True, False, False]
    assert table["decided"].to_list() == [True, True, False]
    # an undecided measurement says nothing about the plan's verdict
    assert table["right"].to_list() == [True, False, None]
    summary = heldout.summary(table).to_dicts()
    assert [(r["load_level"], r["cells"], r["decided"], r["right"]) for r in summary] == [
        (1.0, 1, 1, 1),
        (2.0, 1, 1, 0),
        (4.0, 1, 0, 0),
    ]
    assert summary[1]["session_gain_worst_abs"] == pytest.approx(0.3)
    assert summary[0]["session_gain_within_goal"] == 0.0  # 20% misses the 15% goal


def test_a_plan_held_against_its_own_run_agrees_exactly(tmp_path: Path) -> None:
    """The measured side reads a run as the planner does: a plan's own run folder as the
    "measured" run gives back the plan's gains (error 0) and sampling intervals in every
    cell."""
    out = plan.plan(
        ROOT / "scenarios/decision-cpu.toml",
        overrides=[
            "target.sim.profile=builtin:cpu-tiny",
            "sessions.initial_context_tokens=[12000]",
            "load.levels=[1, 2]",
        ],
        runs_dir=tmp_path,
        seeds=1,
        sensitivity=False,
    )
    planned = pl.read_parquet(out / "whatif.parquet")
    (config,) = (out / "configs").iterdir()
    measured = heldout.measured_decision(load_run(config), 1.1)
    table = heldout.compare(planned, measured)
    assert table.height == 2 * 2  # placements x levels
    assert table["session_gain_error"].abs().max() == pytest.approx(0.0, abs=1e-12)
    assert table["later_gain_error"].abs().max() == pytest.approx(0.0, abs=1e-12)
    # the plan's sampling interval is the measured one; its verdict reads that widened
    # by the model's error, so it agrees or stays undecided, never the other way
    both = planned.join(measured, on=["placement", "context_tokens", "load_level"], suffix="_m")
    assert (both["session_gain_sampling_low"] - both["session_gain_low_m"]).abs().max() < 1e-12
    assert (both["session_gain_sampling_high"] - both["session_gain_high_m"]).abs().max() < 1e-12
    assert (both["session_gain_low"] < both["session_gain_low_m"]).all()
    for row in table.iter_rows(named=True):
        assert row["verdict_planned"] in (row["verdict_measured"], "undecided"), row
    # fixed placement on a cache that holds everything: the pool cannot pay
    fixed = table.filter(pl.col("placement") == "fixed")
    assert fixed["verdict_measured"].to_list() == ["does not pay"] * 2
