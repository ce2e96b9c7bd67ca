"""The replay's decision: the planner's reduction, its table, and the turns it names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.records.run import Run, load_run
from sessiongen.report import decision
from sessiongen.report.cautions import point_to_problems
from sessiongen.report.document import Element, Heading, Paragraph, Table
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Both arms of two placements, five sessions each, on the virtual clock (1 s)."""
    sc = scenario.load(
        ROOT / "scenarios/smoke.toml",
        ["sessions.count=5", 'placement.policies=["alternate","fixed"]'],
    )
    return load_run(virtual_replay(sc, tmp_path_factory.mktemp("plan")))


def test_the_table_reads_the_verdict_off_the_interval_at_pays_at(planned: Run) -> None:
    for pays_at in (0.5, 1.1, 3.0):
        d = decision.decide(planned, pays_at)
        assert d is not None
        frame = decision.table(d)
        assert frame.columns[:3] == [
            "placement",
            "session gain [95% CI]",
            "later-turn gain [95% CI]",
        ]  # one level, one context: not shown
        assert decision.PER_TURN in frame.columns and frame["sessions"].to_list() == [5, 5]
        for row, r in zip(frame.iter_rows(named=True), d.rows.iter_rows(named=True), strict=True):
            low, high = r["session_gain_low"], r["session_gain_high"]
            expected = (
                "pays" if low >= pays_at else "does not pay" if high < pays_at else "undecided"
            )
            assert row["verdict"] == expected
            assert row["session gain [95% CI]"].endswith(f"[{low:.2f}, {high:.2f}]")
    low = decision.decide(planned, 0.5)
    assert low is not None and low.rows["verdict"].to_list() == ["pays", "pays"]


def test_too_few_sessions_is_not_enough_data(tmp_path: Path) -> None:
    sc = scenario.load(ROOT / "scenarios/smoke.toml", ["sessions.count=2"])
    d = decision.decide(load_run(virtual_replay(sc, tmp_path)), 1.1)
    assert d is not None
    assert decision.table(d)["verdict"].to_list() == ["not enough data"]


def test_one_arm_has_no_decision(planned: Run) -> None:
    one = planned.filter(pl.col("cache") == "on")
    assert decision.decide(one, 1.1) is None
    assert "one cache arm" in decision.console_text(None, "sim")
    blocks = decision.section(None)
    assert isinstance(blocks[0], Heading) and not any(isinstance(b, Table) for b in blocks)


def synthetic(later_turn_gain: float, gains: dict[int, float]) -> decision.Decision:
    arm = {"placement": "alternate", "context_tokens": 32768, "load_level": 1.0}
    rows = pl.DataFrame([{**arm, "later_turn_gain": later_turn_gain}])
    turns = pl.DataFrame([{**arm, "turn": t, "pool_gain": g} for t, g in gains.items()])
    return decision.Decision(rows, turns, 1.1, "session gain", trace=False)


def test_a_turn_far_from_the_median_over_turns_is_named() -> None:
    """pressure32k: a median per-turn gain of 1.00 hid turn 2's 4.2x."""
    gains = {1: 1.0, 2: 4.2, 3: 1.0, 4: 1.01, 5: 0.99, 6: 1.0}
    assert decision.apart(synthetic(1.0, gains)) == ["turn 2: 4.20x"]
    # turn 1 (cold) is not a later turn; a turn within SHARP of the median is not named
    assert decision.apart(synthetic(1.0, {1: 9.0, 2: 1.4, 3: 1.0})) == [""]
    # the farthest first, at most MAX_NAMED, then how many more
    many = {2: 8.0, 3: 0.2, 4: 3.0, 5: 2.0, 6: 1.0, 7: 1.0, 8: 1.0}
    assert decision.apart(synthetic(1.0, many)) == [
        "turn 2: 8.00x, turn 3: 0.20x, turn 4: 3.00x, 1 more"
    ]


def test_the_decision_points_to_the_problems_below_it() -> None:
    blocks: list[Element] = [
        Heading("report", 1),
        Heading("Decision: does the pool pay (session gain >= 1.1)?"),
        Table(pl.DataFrame({"verdict": ["pays"]})),
        Paragraph("MEASURED: ..."),
        Heading("Problems"),
        Paragraph("Measurement error above 2% ...", warning=True),
        Paragraph("Late arrivals ...", warning=True),
    ]
    point_to_problems(blocks)
    note = blocks[3]
    assert isinstance(note, Paragraph) and note.warning
    assert note.text == "Read these verdicts with the 2 problems under Problems, below."
    limited: list[Element] = [
        *blocks[:3],
        Heading("Limits of this run"),
        Paragraph("Only 2 sessions per arm ...", warning=True),
    ]
    point_to_problems(limited)
    assert limited[3] == Paragraph(
        "Read these verdicts with the 1 limit under Limits of this run, below.", warning=True
    )
    clean: list[Element] = [
        blocks[0],
        blocks[1],
        blocks[2],
        Heading("Problems"),
        Paragraph("None found."),
    ]
    point_to_problems(clean)
    assert len(clean) == 5


def test_a_trace_names_what_its_intervals_resample(planned: Run) -> None:
    d = decision.decide(planned, 1.1)
    assert d is not None and d.unit == "session"
    blocks = dataclasses.replace(d, rows=d.rows.with_columns(pl.lit("time block").alias("unit")))
    frame = decision.table(blocks)
    assert "time blocks" in frame.columns and "sessions" not in frame.columns
    text = decision.section(blocks)[-1]
    assert isinstance(text, Paragraph) and "bootstraps over time blocks" in text.text


def test_a_planned_configuration_reports_the_plans_row_and_says_planned(tmp_path: Path) -> None:
    from sessiongen.capacity.plan import plan
    from sessiongen.capacity.sweep import SweepOptions

    out = plan(
        ROOT / "scenarios/smoke.toml",
        overrides=["sessions.count=5"],
        runs_dir=tmp_path,
        seeds=2,
        sensitivity=False,
        sweep=SweepOptions(jobs=1),
    )
    whatif = pl.read_parquet(out / "whatif.parquet")
    for folder in ("00-as_given", "00-as_given.r1"):  # either replicate: the plan's pooled row
        d = decision.decide(load_run(out / "configs" / folder), 1.1)
        assert d is not None and d.planned and d.plan == out
        assert d.rows["session_gain_low"].to_list() == whatif["session_gain_low"].to_list()
        assert d.rows["verdict"].to_list() == whatif["verdict"].to_list()
        own = decision.measured_decision(load_run(out / "configs" / folder), 1.1)
        assert own["session_gain_high"][0] < whatif["session_gain_high"][0]  # sampling alone
        assert decision.console_text(d, "SIMULATED (plan)").startswith(f"{d.heading} PLANNED")
        text = decision.section(d)[-1]
        assert isinstance(text, Paragraph)
        assert text.text.startswith("PLANNED") and f"{out.name}/whatif.parquet" in text.text
        assert "MEASURED" not in text.text


def test_a_planned_run_outside_a_plan_says_its_interval_lacks_the_model_error(
    planned: Run,
) -> None:
    d = decision.decide(planned, 1.1)
    assert d is not None and d.planned and d.plan is None
    text = decision.section(d)[-1]
    assert isinstance(text, Paragraph) and text.text.startswith("PLANNED")
    assert "no model error" in text.text and "not a plan's" in text.text
