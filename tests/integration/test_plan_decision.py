"""``sessiongen plan --seeds --pays-at`` and ``--find`` end to end on the smoke scenario
(with enough replicates for the 5 pooled sessions a verdict needs).

The smoke scenario alternates each session's turns over the replicas: on one replica
every later turn finds its prefix locally and the pool adds nothing; on two, every
later turn is a first visit and the pool serves it (1.2x the whole session here).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from sessiongen.analysis.payoff import verdict
from sessiongen.cli import main
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"
SETS = ("--set", "driver.concurrency=1", "--set", 'design.blocks=["off", "on"]')


def test_plan_pools_seeds_into_intervals_and_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fitted profile whose held-out model error is small, so that the verdicts read the
    # pooled sessions' sampling (the shipped default would leave 1.2x undecided).
    profile = tmp_path / "fitted.toml"
    profile.write_text(
        "[target.sim]\nprefill_s_per_ktok = 0.136\n\n[fit]\nfitted = true\n\n"
        "[fit.model_error]\none_in_flight = 0.01\nloaded = 0.01\n"
    )
    main([
        "plan", str(SMOKE), "--vary", "target.sim.replicas=1,2", "--seeds", "3",
        "--pays-at", "1.1", "--jobs", "1", "--no-progress", "--runs-dir", str(tmp_path), *SETS,
        "--set", "objective.ttft_s=0.2", "--no-sensitivity", "--set", "sessions.count=6",
        "--set", f"target.sim.profile={profile}",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert out.index("Decision (PLANNED)") < out.index("What if")
    (folder,) = tmp_path.glob("plan-*")
    assert sorted(p.name for p in (folder / "configs").iterdir()) == [
        "00-replicas=1", "00-replicas=1.r1", "00-replicas=1.r2",
        "01-replicas=2", "01-replicas=2.r1", "01-replicas=2.r2"]  # fmt: skip
    whatif = pl.read_parquet(folder / "whatif.parquet").sort("target.sim.replicas")
    assert whatif["replicates"].to_list() == [3, 3]
    # smoke plans the same records whatever the seed: the three replicates are one
    assert whatif["distinct_replicates"].to_list() == [1, 1]
    assert whatif["sessions"].to_list() == [6, 6]  # 6 sessions x 1 distinct replicate
    for r in whatif.iter_rows(named=True):
        assert r["session_gain_low"] <= r["session_gain"] <= r["session_gain_high"]
        assert r["verdict"] == verdict(r["session_gain_low"], r["session_gain_high"], 1.1)
        assert 0 <= r["good_turns_on_low"] <= r["good_turns_on"] <= r["good_turns_on_high"] <= 1
    assert whatif["verdict"].to_list() == ["does not pay", "pays"]
    assert "does not pay" in out and "pays" in out
    report = (folder / "report" / "report.md").read_text()
    assert report.index("## Decision") < report.index("## What if")
    assert "session gain [95% CI]" in report and "goodput on [95% CI]" in report
    assert "whatif.png" in report


def test_find_brackets_where_the_pool_starts_to_pay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([
        "plan", str(SMOKE), "--find", "target.sim.replicas=1:3", "--seeds", "2",
        "--set", "sessions.count=3",
        "--jobs", "1", "--no-progress", "--runs-dir", str(tmp_path), *SETS,
    ])  # fmt: skip
    out = capsys.readouterr().out
    (folder,) = tmp_path.glob("find-*")
    brackets = pl.read_parquet(folder / "brackets.parquet")
    row = brackets.row(0, named=True)
    whatif = pl.read_parquet(folder / "whatif.parquet").sort("find_value")
    # every region of the planned verdicts, in order (the interior value 2 planned too)
    verdicts = whatif["verdict"].to_list()
    runs = [(v, [x for x, w in zip((1, 2, 3), verdicts, strict=True) if w == v]) for v in
            dict.fromkeys(verdicts)]  # fmt: skip
    regions = [f"{v} at replicas={xs[0]}" + (f"..{xs[-1]}" if len(xs) > 1 else "")
               for v, xs in runs]  # fmt: skip
    assert row["regions"] == " | ".join(regions)
    whole = f"{verdicts[0]} over the whole range"
    assert ("; ".join(regions) if len(regions) > 1 else whole) in out
    assert row["interior_checked"]
    # the session gain itself (1.0 on one replica, more on two) crosses 1.1 between 1 and 2
    gains = whatif["session_gain"].to_list()
    assert gains[0] < 1.1 <= gains[1] and 1 < row["point_crossing"] < 2
    assert f"point estimate crosses 1.1 at replicas=~{row['point_crossing']:.4g}" in out
    planned = pl.read_parquet(folder / "whatif.parquet")["target.sim.replicas"].to_list()
    assert sorted(planned) == ["1", "2", "3"]
    report = (folder / "report" / "report.md").read_text()
    assert "Where the verdict flips along target.sim.replicas" in report


def test_a_bad_find_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(SMOKE), "--find", "target.sim.replicas=3:1"])
    assert exc.value.code == 2
    assert "--find" in capsys.readouterr().err


def test_a_level_that_overloads_the_off_arm_is_unstable_not_pays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six 128k sessions open-loop, alternating over two replicas: at 0.04 sessions/s
    pool off recomputes every turn's 128k prefix and falls behind (its queue grows with
    the run, and so does the gain), pool on keeps up; at 0.005 both do."""
    main([
        "plan", str(ROOT / "scenarios" / "load128k.toml"), "--seeds", "2", "--jobs", "1",
        "--no-progress", "--runs-dir", str(tmp_path), "--set", "load.levels=[0.005, 0.04]",
        "--set", 'placement.policies=["alternate"]', "--set", "sessions.count=6",
        "--no-sensitivity",
    ])  # fmt: skip
    out = capsys.readouterr().out
    (folder,) = tmp_path.glob("plan-*")
    whatif = pl.read_parquet(folder / "whatif.parquet").sort("load_level")
    light, heavy = whatif.iter_rows(named=True)
    assert (light["stable_off"], light["stable_on"]) == (True, True)
    assert not light["verdict"].startswith("unstable")
    assert (heavy["stable_off"], heavy["stable_on"]) == (False, True)
    assert heavy["ttft_growth_off"] > 0.05 >= heavy["ttft_growth_on"]
    assert heavy["verdict"] == "unstable (OFF queue grows)"
    assert heavy["session_gain"] is not None  # still shown, marked
    report = (folder / "report" / "report.md").read_text()
    decision = report[report.index("## Decision") : report.index("## What if")]
    for text in (out[: out.index("What if")], decision):
        assert text.count("unstable (OFF queue grows)") == 1
        assert text.count("] (unstable)") == 2  # the heavy cell's two gains, marked
    assert "An arm is unstable at a level where" in decision


def test_find_by_objective_brackets_each_arm_along_the_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Along the arrival rate (a key that sets the cells' own load level): pool off
    recomputes every 128k prefix and stops meeting the 40 s objective (unstable at 0.08
    sessions/s), and each arm gets a bracket of its own."""
    main([
        "plan", str(ROOT / "scenarios" / "load128k.toml"), "--seeds", "2", "--no-progress",
        "--runs-dir", str(tmp_path), "--set", 'placement.policies=["alternate"]',
        "--set", "sessions.turns=3", "--find-by", "objective",
        "--find", "load.levels=0.005:0.08", "--find-steps", "1",
    ])  # fmt: skip
    out = capsys.readouterr().out
    (folder,) = tmp_path.glob("find-*")
    brackets = pl.read_parquet(folder / "brackets.parquet").sort("cache")
    assert brackets["cache"].to_list() == ["off", "on"]
    assert "load_level" not in brackets.columns  # the key moves it: it names no cell
    off = brackets.row(0, named=True)
    assert off["last_verdict"] == "misses" and off["flips"]
    whatif = pl.read_parquet(folder / "whatif.parquet").sort("load_level")
    top = whatif.row(-1, named=True)
    assert top["load_level"] == 0.08 and top["objective_off"] == "misses"
    assert top["stable_off"] is False  # an arm whose queue grows misses, whatever its share
    for r in whatif.iter_rows(named=True):
        for arm in ("off", "on"):
            assert r[f"good_turns_{arm}_low"] <= r[f"good_turns_{arm}_high"]
    assert "Where each arm stops meeting the objective" in out
    assert "cache off: " in out and "cache on: " in out
    # where each arm meets the objective, as planned values (the ON arm's range included)
    assert "meets the objective: cache off at " in out and "; cache on at " in out
    # --find-steps 1 leaves room for one of the three interior values
    assert "interior not checked (1 of 3 interior values planned" in out
    report = (folder / "report" / "report.md").read_text()
    assert "Where each arm's objective verdict flips along load.levels" in report


def test_find_by_objective_needs_an_objective(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(SMOKE), "--find-by", "objective", "--find", "target.sim.replicas=1:2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--find-by objective" in err and "objective.ttft_s" in err and len(err.splitlines()) == 1
