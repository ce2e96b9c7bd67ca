"""Single-arm runs merged into one run of the whole design (sessiongen.records.merge)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from sessiongen import analysis, report
from sessiongen.cli import cli
from sessiongen.errors import RunDirError
from sessiongen.records.merge import merge_runs
from tests.support.arms import split_arm
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

SPEC = SyntheticSpec(sessions=5, turns=3, contexts=(4096,), block_salts=True, simulated=False)


def halves(tmp_path: Path, spec: SyntheticSpec = SPEC, name: str = "a") -> tuple[Path, Path, Path]:
    whole = write_run(tmp_path / name / "whole", spec)
    off = split_arm(whole, "off", tmp_path / name / "off")
    on = split_arm(whole, "on", tmp_path / name / "on")
    return whole, off, on


def test_merged_halves_are_the_whole_run(tmp_path: Path) -> None:
    whole, off, on = halves(tmp_path)
    # The halves alone have no speedup; merged in either order, the whole run's.
    assert analysis.speedup_table(analysis.load_run(off))["speedup"].null_count() == 6
    for order in ((off, on), (on, off)):
        merged = merge_runs(order, tmp_path / f"merged-{order[0].name}")
        a, b = analysis.load_run(whole), analysis.load_run(merged)
        keys = ["block", "session_id", "turn", "warmup", "replica"]
        left = pl.read_parquet(whole / "requests.parquet").drop("run_id").sort(keys)
        right = pl.read_parquet(merged / "requests.parquet").drop("run_id").sort(keys)
        assert right.select(left.columns).equals(left)
        assert analysis.speedup_table(b).equals(analysis.speedup_table(a))
        assert analysis.session_speedup(b).equals(analysis.session_speedup(a))
        manifest = json.loads((merged / "manifest.json").read_text())
        assert [b["cache"] for b in manifest["blocks"]] == ["off", "on", "on", "off"] * 2
        assert {m["run_id"] for m in manifest["merged_from"]} == {off.name, on.name}
        assert manifest["blocks"][3]["source_run"] == off.name
        assert manifest["blocks"][3]["source_block"] == 1


def test_the_merged_report_is_the_whole_runs(tmp_path: Path) -> None:
    whole, off, on = halves(tmp_path)
    merged = merge_runs([off, on], tmp_path / "merged")
    outputs = []
    for run_dir in (whole, merged):
        folder = report.write_report(run_dir).parent
        outputs.append(((folder / "summary.csv").read_text(), report.read_cautions(folder)))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"seed": 1}, "seed 1 differs from 0"),
        ({"sessions": 6}, "scenario differs (digest "),
        ({"simulated": True}, "target differs: kind"),
    ],
)
def test_runs_of_different_designs_are_refused(
    tmp_path: Path, change: dict[str, object], why: str
) -> None:
    _whole, off, _on = halves(tmp_path)
    _other, _off2, on2 = halves(tmp_path, with_changes(SPEC, **change), name="b")
    with pytest.raises(RunDirError, match="runs of one design only") as err:
        merge_runs([off, on2])
    assert why in str(err.value) and str(on2) in str(err.value)


def test_two_runs_of_one_arm_are_refused(tmp_path: Path) -> None:
    _whole, off, _on = halves(tmp_path)
    _other, off2, _on2 = halves(tmp_path, with_changes(SPEC, noise_seed=3), name="b")
    with pytest.raises(RunDirError, match=r"holds cache arm off, as .* does"):
        merge_runs([off, off2])
    with pytest.raises(RunDirError, match="two or more run folders"):
        merge_runs([off])


def test_cli_merge_and_report_of_two_runs(tmp_path: Path) -> None:
    _whole, off, on = halves(tmp_path)
    runner = CliRunner()
    out = runner.invoke(cli, ["merge", str(off), str(on), "-o", str(tmp_path / "m")])
    assert out.exit_code == 0, out.output
    assert out.output == f"merged: {tmp_path / 'm'}\n"
    out = runner.invoke(cli, ["report", str(off), str(on)])
    assert out.exit_code == 0, out.output
    merged_line, report_line = out.output.splitlines()
    assert merged_line.startswith(f"merged: {off.parent}/") and "-merged-" in merged_line
    assert report_line.endswith("report/report.md")
    _w, _o, on_b = halves(tmp_path, with_changes(SPEC, seed=1), name="b")
    out = runner.invoke(cli, ["report", str(off), str(on_b)])
    assert out.exit_code == 2
    [line] = out.output.splitlines()
    assert line.startswith("sessiongen: error: ") and "seed 1 differs from 0" in line


def test_comparing_an_off_run_with_an_on_run_says_to_merge_them(tmp_path: Path) -> None:
    whole, off, on = halves(tmp_path)
    result = analysis.compare_runs(analysis.load_run(off), analysis.load_run(on))
    [note] = [n for n in result.notes if "merge them" in n]
    assert note.startswith("note: RUN_A holds only cache off and RUN_B only cache on; ")
    assert note.endswith("(sessiongen report RUN_A RUN_B)")
    same = analysis.compare_runs(analysis.load_run(whole), analysis.load_run(whole))
    assert not [n for n in same.notes if "merge them" in n]
