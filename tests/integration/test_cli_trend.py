"""trend check / plot through the command line: exit status follows the verdict."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sessiongen.cli import cli
from tests.support.trend_history import Night, write_history


def test_trend_check_exits_1_on_a_lasting_slowdown_and_0_on_flat(tmp_path: Path) -> None:
    flat, slow = tmp_path / "flat", tmp_path / "slow"
    write_history(flat, [Night()] * 8, seed=1)
    slower = Night(ttft={("*", "*", "*"): 1.3}, versions={"vllm": "0.33.0"})
    write_history(slow, [Night()] * 5 + [slower] * 3, seed=1)
    runner = CliRunner()
    ok = runner.invoke(cli, ["trend", "check", "--store", str(flat)])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(cli, ["trend", "check", "--store", str(slow)])
    assert bad.exit_code == 1, bad.output
    assert "regression" in bad.output.lower()
    plots = runner.invoke(
        cli, ["trend", "plot", "--store", str(slow), "--out", str(tmp_path / "p")]
    )
    assert plots.exit_code == 0, plots.output
    pngs = list((tmp_path / "p").rglob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_bad_metric_threshold_is_a_usage_error(tmp_path: Path) -> None:
    write_history(tmp_path, [Night()] * 3, seed=2)
    result = CliRunner().invoke(
        cli, ["trend", "check", "--store", str(tmp_path), "--metric-threshold", "ttft"]
    )
    assert result.exit_code == 2
