"""compare: paired by session, decided on the interval of B/A, exit codes per verdict.

Run B is a repeat of run A's scenario (same sessions, new request noise: ``noise_seed``),
with every latency multiplied by a known ``slowdown``: the true ratio of every cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from sessiongen import analysis
from sessiongen.analysis import stats
from sessiongen.cli import cli
from sessiongen.errors import RunDirError
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

#: 8 sessions alike within 10%, 1% request noise: precise enough to call "no change" at 5%.
SPEC = SyntheticSpec(noise_sigma=0.01, session_sigma=0.1)


def _run(root: Path, spec: SyntheticSpec = SPEC, **changes: object) -> analysis.Run:
    return analysis.load_run(write_run(root, with_changes(spec, **changes)))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> analysis.Run:
    return _run(tmp_path_factory.mktemp("a"))


def _repeat(tmp_path: Path, **changes: object) -> analysis.Run:
    """Another run of the same scenario (same sessions, new noise)."""
    return _run(tmp_path, noise_seed=7, **changes)


def test_decide_ratio_reads_the_interval_against_the_margin() -> None:
    assert stats.decide_ratio(1.06, 1.2, 0.05) == "slower"
    assert stats.decide_ratio(0.8, 0.94, 0.05) == "faster"
    assert stats.decide_ratio(0.96, 1.04, 0.05) == "no change"
    assert stats.decide_ratio(1.01, 1.08, 0.05) == "inconclusive"  # above 1, not beyond 5%
    assert stats.decide_ratio(0.9, 1.1, 0.05) == "inconclusive"
    assert stats.decide_ratio(float("nan"), 1.0, 0.05) == "inconclusive"


def test_planted_slowdown_is_slower_exit_1(baseline: analysis.Run, tmp_path: Path) -> None:
    result = analysis.compare_runs(baseline, _repeat(tmp_path, slowdown=1.3))
    assert result.verdict == "slower" and result.exit_code == 1
    assert result.frame.height == 24 and result.counts()["slower"] == 24
    assert result.frame["paired"].all() and (result.frame["sessions"] == 8).all()
    assert result.frame["ratio"].median() == pytest.approx(1.3, rel=0.03)
    assert result.conf == pytest.approx(0.90)
    assert "SLOWER" in result.to_text() and "exit status 1" in result.summary()


def test_repeat_is_no_change_and_faster_is_exit_0(baseline: analysis.Run, tmp_path: Path) -> None:
    same = analysis.compare_runs(baseline, _repeat(tmp_path / "same"))
    assert same.verdict == "no change" and same.exit_code == 0, same.to_text()
    faster = analysis.compare_runs(baseline, _repeat(tmp_path / "fast", slowdown=0.7))
    assert faster.verdict == "faster" and faster.exit_code == 0


def test_a_shift_within_run_to_run_noise_is_not_a_slowdown(
    baseline: analysis.Run, tmp_path: Path
) -> None:
    # A 5% shift (host, clock, restart luck): pooled requests made it "significant" in
    # most cells (p ~ 1e-4). On the paired interval it sits on the margin: inconclusive.
    result = analysis.compare_runs(baseline, _repeat(tmp_path, slowdown=1.05))
    assert result.counts().get("slower", 0) == 0, result.to_text()
    assert result.verdict == "inconclusive" and result.exit_code == 3
    wider = analysis.compare_runs(baseline, _repeat(tmp_path / "w", slowdown=1.05), threshold=0.15)
    assert wider.verdict == "no change"


def test_false_slower_and_power_over_seeds(tmp_path: Path) -> None:
    # 4 sessions (the 128k scenarios' count), synthetic session spread and 6% noise.
    # A 2% shift must never make a cell "slower" (5% margin); a 30% slowdown must be
    # "slower" in almost every cell.
    spec = SyntheticSpec(sessions=4, turns=3, placements=("alternate",))
    slower_cells = found = 0
    for seed in range(6):
        a = _run(tmp_path / f"a{seed}", spec, seed=seed)
        b = _run(tmp_path / f"b{seed}", spec, seed=seed, noise_seed=50 + seed, slowdown=1.02)
        c = _run(tmp_path / f"c{seed}", spec, seed=seed, noise_seed=90 + seed, slowdown=1.3)
        slower_cells += analysis.compare_runs(a, b).counts().get("slower", 0)
        found += analysis.compare_runs(a, c).counts().get("slower", 0)
    assert slower_cells == 0
    assert found >= 0.8 * 6 * 6, found


def test_threshold_is_the_margin(baseline: analysis.Run, tmp_path: Path) -> None:
    slower = _repeat(tmp_path, slowdown=1.2)
    assert analysis.compare_runs(baseline, slower, threshold=0.05).verdict == "slower"
    assert analysis.compare_runs(baseline, slower, threshold=0.3).verdict == "no change"


def test_unpairable_sessions_fall_back_to_unpaired_and_say_so(
    baseline: analysis.Run, tmp_path: Path
) -> None:
    partial = _repeat(tmp_path).filter(pl.col("session_index") < 6)
    result = analysis.compare_runs(baseline, partial)
    assert not result.frame["paired"].any()
    assert any("could not be paired" in note for note in result.notes)
    assert "unp." in result.to_text()


def test_few_sessions_are_warned_about(tmp_path: Path) -> None:
    spec = with_changes(SPEC, sessions=2, turns=2, placements=("alternate",))
    result = analysis.compare_runs(_run(tmp_path / "a", spec), _run(tmp_path / "b", spec))
    assert any(f"fewer than {stats.MIN_SESSIONS} sessions" in n for n in result.notes)


def test_other_scenarios_are_refused_unless_forced(baseline: analysis.Run, tmp_path: Path) -> None:
    other = _run(tmp_path, turns=5)
    with pytest.raises(RunDirError, match="scenario_digest"):
        analysis.compare_runs(baseline, other)
    forced = analysis.compare_runs(baseline, other, force=True)
    assert any("scenario_digest" in note and "forced" in note for note in forced.notes)
    missing = forced.frame.filter(pl.col("turn") == 6)
    assert missing["n_b"].to_list() == [0, 0, 0, 0]
    assert set(missing["decision"]) == {"missing"}
    assert any("in one run only" in note for note in forced.notes)


def test_other_time_scales_are_refused_unless_forced(
    baseline: analysis.Run, tmp_path: Path
) -> None:
    run_dir = write_run(tmp_path, with_changes(SPEC, noise_seed=3))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["target"]["time_scale"] = 0.05  # same scenario digest, another time scale
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    other = analysis.load_run(run_dir)
    with pytest.raises(RunDirError, match=r"time scale 0.05 differs .* 0.1"):
        analysis.compare_runs(baseline, other)
    forced = analysis.compare_runs(baseline, other, force=True)
    assert any("time scale" in note for note in forced.notes)


def test_cli_exit_codes(tmp_path: Path) -> None:
    spec = with_changes(SPEC, placements=("alternate",), turns=3)
    a = write_run(tmp_path, spec)
    runs = {
        name: write_run(tmp_path, with_changes(spec, noise_seed=i + 1, slowdown=slowdown))
        for i, (name, slowdown) in enumerate(
            [("same", 1.0), ("slow", 1.3), ("fast", 0.7), ("shift", 1.05)]
        )
    }
    runner = CliRunner()
    codes = {
        name: runner.invoke(cli, ["compare", str(a), str(path)]).exit_code
        for name, path in runs.items()
    }
    assert codes == {"same": 0, "slow": 1, "fast": 0, "shift": 3}
    other = write_run(tmp_path / "other", with_changes(spec, turns=2))
    refused = runner.invoke(cli, ["compare", str(a), str(other)])
    assert refused.exit_code == 2 and "--force" in refused.output
    assert "Exit status" in runner.invoke(cli, ["compare", "--help"]).output
