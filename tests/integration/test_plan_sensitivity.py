"""``sessiongen plan`` reads every verdict over the profile's box end to
end on the smoke scenario: the ends' runs and table, the what-if columns, the console
lines, the report's section and tornado chart; ``--no-sensitivity`` plans none."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from sessiongen.capacity.sensitivity import SENSITIVITY_COLUMNS
from sessiongen.cli import main
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"
SETS = ("--set", "driver.concurrency=1", "--set", 'design.blocks=["off", "on"]',
        "--set", "sessions.count=6")  # fmt: skip
#: The study profile's parameters that are not zero: 8, two ends each.
MOVED = 8


def test_plan_reads_each_verdict_at_both_ends_of_every_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["plan", str(SMOKE), "--vary", "target.sim.replicas=1,2", "--seeds", "1",
          "--jobs", "1", "--no-progress", "--runs-dir", str(tmp_path), *SETS])  # fmt: skip
    out = capsys.readouterr().out
    (folder,) = tmp_path.glob("plan-*")
    ends = pl.read_parquet(folder / "sensitivity.parquet")
    assert ends.height == 2 * 2 * MOVED  # two configurations
    assert ends.columns[-len(SENSITIVITY_COLUMNS) :] == list(SENSITIVITY_COLUMNS)
    assert len(list((folder / "sensitivity").iterdir())) == 2 * 2 * MOVED
    assert "01-replicas=2.prefill_s_per_ktok-low" in {
        p.name for p in (folder / "sensitivity").iterdir()
    }
    assert set(ends["source"]) == {"+-10%"}
    assert ends.filter(pl.col("parameter") == "prefill_s_per_ktok")["change"].to_list() == [
        pytest.approx(-0.1), pytest.approx(0.1)] * 2  # fmt: skip
    whatif = pl.read_parquet(folder / "whatif.parquet").sort("config")
    for row in whatif.iter_rows(named=True):
        mine = ends.filter(pl.col("config") == row["config"])
        flipping = list(dict.fromkeys(mine.filter("flips")["parameter"]))
        assert (mine["verdict"] != row["verdict"]).to_list() == mine["flips"].to_list()
        if flipping:
            assert row["sensitive_to"] == ", ".join(flipping)
            assert f"{row['verdict']} unless {flipping[0]} is 10% " in row["robustness"]
        else:
            assert row["sensitive_to"] is None
            assert (
                row["robustness"]
                == f"robust: {row['verdict']} at both ends of 8 parameters (+-10%)"
            )
        # one replica: the pool serves nothing, and no parameter changes that
        if row["target.sim.replicas"] == "1":
            assert mine["gain_ratio"].to_list() == pytest.approx([1.0] * 2 * MOVED)
    prefill = ends.filter((pl.col("config") == 1) & (pl.col("parameter") == "prefill_s_per_ktok"))
    moved = [abs(r - 1) for r in prefill["gain_ratio"].to_list()]
    assert len(moved) == 2 and min(moved) > 0  # two replicas: prefill moves the gain
    assert out.index("Sensitivity (PLANNED)") < out.index("What if")
    assert "replicas=2; alternate, context 2048, level 1: " in out
    report = (folder / "report" / "report.md").read_text()
    assert report.index("## Decision") < report.index("## Sensitivity") < report.index("## What if")
    assert (folder / "report" / "tornado.png").is_file() and "tornado.png" in report


def test_no_sensitivity_plans_no_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", str(SMOKE), "--seeds", "1", "--no-sensitivity", "--jobs", "1",
          "--no-progress", "--runs-dir", str(tmp_path), *SETS])  # fmt: skip
    out = capsys.readouterr().out
    (folder,) = tmp_path.glob("plan-*")
    assert not (folder / "sensitivity.parquet").exists()
    assert not (folder / "sensitivity").exists()
    assert "robustness" not in pl.read_parquet(folder / "whatif.parquet").columns
    assert "Sensitivity" not in out
    assert "## Sensitivity" not in (folder / "report" / "report.md").read_text()


def test_a_pool_parameters_end_plans_the_pool_on_arm_alone_and_matches_a_full_plan(
    tmp_path: Path,
) -> None:
    from sessiongen.capacity.sensitivity import POOL_ONLY
    from sessiongen.capacity.virtual import plan_run
    from sessiongen.records.io import read_manifest
    from sessiongen.scenario.spec import load as load_scenario

    main(["plan", str(SMOKE), "--seeds", "1", "--jobs", "1", "--no-progress",
          "--runs-dir", str(tmp_path), *SETS])  # fmt: skip
    (folder,) = tmp_path.glob("plan-*")
    zero = read_manifest(folder / "configs" / "00-as_given")
    ends = pl.read_parquet(folder / "sensitivity.parquet")
    pool_ends = ends.filter(pl.col("parameter").is_in(POOL_ONLY))
    assert pool_ends.height >= 2  # the study profile moves the pool's link
    keys = ["block", "session_index", "turn"]
    for row in pool_ends.iter_rows(named=True):
        end = folder / "sensitivity" / f"00-as_given.{row['parameter']}-{row['end']}"
        manifest = read_manifest(end)
        off = [b for b in manifest["blocks"] if b["cache"] == "off"]
        assert off and all(b.get("source_run") == zero["run_id"] for b in off)
        assert all("source_run" not in b for b in manifest["blocks"] if b["cache"] != "off")
        # the same end planned whole, both arms, gives the same records
        sets = [a for a in SETS if a != "--set"]
        full = plan_run(load_scenario(SMOKE, [*sets, row["setting"]]), run_id="full").requests
        mine = pl.read_parquet(end / "requests.parquet")
        assert set(mine["run_id"]) == {manifest["run_id"]}
        assert mine.sort(keys)["e2e_s"].to_list() == full.sort(keys)["e2e_s"].to_list()
        assert mine.sort(keys)["cache"].to_list() == full.sort(keys)["cache"].to_list()
