"""compare: paired by session, run-to-run noise, Holm over cells, failures count.

Run B is a repeat of run A's scenario (same sessions, new request noise: ``noise_seed``),
with every latency multiplied by a known ``slowdown``: the true ratio of every cell.
Tests of the session-level mechanics give the run-to-run noise as zero (``QUIET``), as
for runs known to carry none; the default (4% assumed) has tests of its own.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from sessiongen import analysis
from sessiongen.analysis import stats
from sessiongen.analysis.runnoise import DEFAULT_RUN_NOISE, RunNoise
from sessiongen.cli import cli
from sessiongen.errors import RunDirError
from sessiongen.records.format import CELL_KEYS
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

#: 8 sessions alike within 10%, 1% request noise: precise enough to call "no change" at 5%.
SPEC = SyntheticSpec(noise_sigma=0.01, session_sigma=0.1)
#: No run-to-run noise: the session-level interval alone.
QUIET = RunNoise(0.0, "given")


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
    result = analysis.compare_runs(baseline, _repeat(tmp_path, slowdown=1.3), run_noise=QUIET)
    assert result.verdict == "slower" and result.exit_code == 1
    assert result.frame.height == 24 and result.counts()["slower"] == 24
    assert result.frame["paired"].all() and (result.frame["sessions"] == 8).all()
    assert result.frame["ratio"].median() == pytest.approx(1.3, rel=0.03)
    assert result.conf == pytest.approx(0.90)
    assert "SLOWER" in result.to_text() and "exit status 1" in result.summary()


def test_repeat_is_no_change_and_faster_is_exit_0(baseline: analysis.Run, tmp_path: Path) -> None:
    same = analysis.compare_runs(baseline, _repeat(tmp_path / "same"), run_noise=QUIET)
    assert same.verdict == "no change" and same.exit_code == 0, same.to_text()
    faster = analysis.compare_runs(
        baseline, _repeat(tmp_path / "fast", slowdown=0.7), run_noise=QUIET
    )
    assert faster.verdict == "faster" and faster.exit_code == 0


def test_a_shift_within_run_to_run_noise_is_not_a_slowdown(
    baseline: analysis.Run, tmp_path: Path
) -> None:
    # A 5% shift (host, clock, restart luck): pooled requests made it "significant" in
    # most cells (p ~ 1e-4). On the paired interval it sits on the margin: inconclusive.
    result = analysis.compare_runs(baseline, _repeat(tmp_path, slowdown=1.05), run_noise=QUIET)
    assert result.counts().get("slower", 0) == 0, result.to_text()
    assert result.verdict == "inconclusive" and result.exit_code == 3
    wider = analysis.compare_runs(
        baseline, _repeat(tmp_path / "w", slowdown=1.05), threshold=0.15, run_noise=QUIET
    )
    assert wider.verdict == "no change"


def test_false_slower_and_power_over_seeds(tmp_path: Path) -> None:
    # Synthetic session spread and 6% request noise, 6 cells. A 2% shift must never make
    # a cell "slower" (5% margin). A 30% slowdown must make every run "slower" at 5
    # sessions (the 128k scenarios' count; with Holm over the cells and t on 4 df not
    # every cell shows it there) and almost every cell at 8.
    slower_cells = verdicts = found = 0
    for seed in range(6):
        for sessions in (5, 8):
            spec = SyntheticSpec(sessions=sessions, turns=3, placements=("alternate",))
            a = _run(tmp_path / f"a{seed}-{sessions}", spec, seed=seed)
            b = _run(
                tmp_path / f"b{seed}-{sessions}",
                spec,
                seed=seed,
                noise_seed=50 + seed,
                slowdown=1.02,
            )
            c = _run(
                tmp_path / f"c{seed}-{sessions}",
                spec,
                seed=seed,
                noise_seed=90 + seed,
                slowdown=1.3,
            )
            slower_cells += analysis.compare_runs(a, b, run_noise=QUIET).counts().get("slower", 0)
            slow = analysis.compare_runs(a, c, run_noise=QUIET)
            verdicts += slow.verdict == "slower"
            if sessions == 8:
                found += slow.counts().get("slower", 0)
    assert slower_cells == 0
    assert verdicts == 12
    assert found >= 0.8 * 6 * 6, found


def test_threshold_is_the_margin(baseline: analysis.Run, tmp_path: Path) -> None:
    slower = _repeat(tmp_path, slowdown=1.2)
    assert analysis.compare_runs(baseline, slower, run_noise=QUIET).verdict == "slower"
    assert (
        analysis.compare_runs(baseline, slower, threshold=0.3, run_noise=QUIET).verdict
        == "no change"
    )


def test_unpairable_sessions_fall_back_to_unpaired_and_say_so(
    baseline: analysis.Run, tmp_path: Path
) -> None:
    partial = _repeat(tmp_path).filter(pl.col("session_index") < 6)
    result = analysis.compare_runs(baseline, partial, run_noise=QUIET)
    assert not result.frame["paired"].any()
    assert any("could not be paired" in note for note in result.notes)
    assert "unp." in result.to_text()


def test_few_sessions_are_inconclusive_whatever_the_data(tmp_path: Path) -> None:
    # With 2 sessions the expanded interval is the min and max of 3 distinct resamples:
    # even a 50% slowdown is "not enough data", never a verdict.
    spec = with_changes(SPEC, sessions=2, turns=2, placements=("alternate",))
    a = _run(tmp_path / "a", spec)
    result = analysis.compare_runs(a, _run(tmp_path / "b", spec, slowdown=1.5), run_noise=QUIET)
    assert set(result.frame["decision"]) == {"inconclusive"}
    assert result.verdict == "inconclusive" and result.exit_code == 3
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
    assert any("in one side only" in note for note in forced.notes)


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
        name: runner.invoke(cli, ["compare", str(a), str(path), "--run-noise", "0"]).exit_code
        for name, path in runs.items()
    }
    assert codes == {"same": 0, "slow": 1, "fast": 0, "shift": 3}
    # The default assumes run-to-run noise: one run a side cannot show "no change".
    assert runner.invoke(cli, ["compare", str(a), str(runs["same"])]).exit_code == 3
    assert runner.invoke(cli, ["compare", str(a), str(runs["slow"])]).exit_code == 1
    other = write_run(tmp_path / "other", with_changes(spec, turns=2))
    refused = runner.invoke(cli, ["compare", str(a), str(other)])
    assert refused.exit_code == 2 and "--force" in refused.output
    assert "Exit status" in runner.invoke(cli, ["compare", "--help"]).output


#: The reported A/A case: a simulated smoke-sized run (8 sessions, one placement, 6 turns,
#: both arms: 12 cells, intervals about +-2%) whose every cell carries a 3% run effect of
#: its own. The code before exited 1 on 17 of these 50 pairs.
AA = SyntheticSpec(
    sessions=8,
    turns=6,
    placements=("alternate",),
    run_sigma=0.03,
    noise_sigma=0.02,
    session_sigma=0.1,
)


def _aa_codes(tmp_path: Path, seeds: range, slowdown: float) -> list[int]:
    codes = []
    for seed in seeds:
        a = _run(tmp_path / f"a{seed}", AA, seed=seed, noise_seed=1000 + seed)
        b = _run(tmp_path / f"b{seed}", AA, seed=seed, noise_seed=2000 + seed, slowdown=slowdown)
        codes.append(analysis.compare_runs(a, b).exit_code)
    return codes


def test_identical_runs_with_run_noise_are_rarely_called_slower(tmp_path: Path) -> None:
    # Before: the interval saw the sessions of one run only and no cell was corrected for
    # the others: copies of one run with a 3% run effect per cell exited 1 in 7 of 20.
    codes = _aa_codes(tmp_path, range(50), slowdown=1.0)
    assert codes.count(1) <= 0.05 * len(codes), codes


def test_a_30_percent_slowdown_still_exits_1(tmp_path: Path) -> None:
    codes = _aa_codes(tmp_path, range(10), slowdown=1.3)
    assert codes.count(1) == len(codes), codes


def test_failed_requests_count_against_the_run(baseline: analysis.Run, tmp_path: Path) -> None:
    # B is A's own repeat with the slowest 10% of requests per cell turned into
    # timeouts: dropping them made B look as fast or faster ("NO CHANGE", exit 0).
    repeat = _repeat(tmp_path)
    rank = pl.col("ttft_s").rank("ordinal", descending=True).over(list(CELL_KEYS))
    count = pl.len().over(list(CELL_KEYS))
    slowest = rank <= (count * 0.1).ceil()
    timed_out = repeat.requests.with_columns(
        status=pl.when(slowest).then(pl.lit("timeout")).otherwise(pl.col("status")),
        ttft_s=pl.when(slowest).then(None).otherwise(pl.col("ttft_s")),
    )
    b = replace(repeat, requests=timed_out)
    for noise, threshold in ((QUIET, 0.05), (None, 0.05), (QUIET, 0.15), (None, 0.15)):
        # At a 15% margin the code before called every cell "no change": exit 0.
        result = analysis.compare_runs(baseline, b, run_noise=noise, threshold=threshold)
        assert result.verdict != "faster" and result.exit_code != 0, result.to_text()
        assert "faster" not in set(result.frame["decision"])
        assert (result.frame["failed_b"] > 0).all() and (result.frame["failed_a"] == 0).all()
        assert "more failures in B" in set(result.frame["why"]) or result.verdict == "slower"


def test_a_failing_majority_is_slower(baseline: analysis.Run, tmp_path: Path) -> None:
    repeat = _repeat(tmp_path)
    broken = repeat.requests.with_columns(
        status=pl.when(pl.col("turn") == 2).then(pl.lit("timeout")).otherwise(pl.col("status"))
    )
    result = analysis.compare_runs(baseline, replace(repeat, requests=broken), run_noise=QUIET)
    slow = result.frame.filter(pl.col("turn") == 2)
    assert set(slow["decision"]) == {"slower"}, result.to_text()
    assert "failed" in result.to_text()
    assert set(result.frame.filter(pl.col("turn") != 2)["decision"]) == {"no change"}


def test_several_runs_a_side_estimate_the_run_noise(tmp_path: Path) -> None:
    spec = with_changes(AA, run_sigma=0.05, noise_sigma=0.06, session_sigma=0.3)
    side_a = [_run(tmp_path / f"a{i}", spec, noise_seed=10 + i) for i in range(3)]
    side_b = [_run(tmp_path / f"b{i}", spec, noise_seed=20 + i) for i in range(3)]
    result = analysis.compare_runs(side_a, side_b)
    assert result.run_noise.source.startswith("estimated")
    # The runs' df, not the cells': a run's noise is largely common to its cells.
    assert result.run_noise.df == 2 * 2  # (3 - 1) runs x 2 sides
    assert 0.035 < result.run_noise.sd < 0.09, result.run_noise  # 60% upper bound of ~5%
    assert result.exit_code != 1
    # A few timeouts in one cell of one run set tau to 0 for every cell (the failed
    # draws' huge log variance swamped the pooled moment equation).
    spoiled = side_a[0].requests.with_columns(
        status=pl.when(
            (pl.col("turn") == 2) & (pl.col("cache") == "off") & (pl.col("session_index") < 3)
        )
        .then(pl.lit("timeout"))
        .otherwise(pl.col("status"))
    )
    again = analysis.compare_runs([replace(side_a[0], requests=spoiled), *side_a[1:]], side_b)
    assert again.run_noise.sd == pytest.approx(result.run_noise.sd, rel=0.35), again.run_noise
    quiet = with_changes(AA, run_sigma=0.0, noise_sigma=0.01, session_sigma=0.1)
    side_a = [_run(tmp_path / f"qa{i}", quiet, noise_seed=30 + i) for i in range(3)]
    side_b = [_run(tmp_path / f"qb{i}", quiet, noise_seed=40 + i) for i in range(3)]
    calm = analysis.compare_runs(side_a, side_b)
    assert calm.run_noise.sd < 0.01 and calm.verdict == "no change", calm.to_text()


def test_default_run_noise_is_said(baseline: analysis.Run, tmp_path: Path) -> None:
    result = analysis.compare_runs(baseline, _repeat(tmp_path))
    assert result.run_noise == DEFAULT_RUN_NOISE
    text = result.to_text()
    assert "run-to-run noise 4.0% per run (assumed" in text
    assert "cannot be shown" in text and result.verdict == "inconclusive"


def test_the_trend_store_gives_the_run_noise(tmp_path: Path) -> None:
    from sessiongen import trend

    spec = with_changes(AA, placements=("alternate",), turns=3)
    runs = [write_run(tmp_path / "runs", with_changes(spec, noise_seed=60 + i)) for i in range(4)]
    store = tmp_path / "store"
    runner = CliRunner()
    trend.trend_add(runs[:2], store)
    few = runner.invoke(cli, ["compare", str(runs[0]), str(runs[3]), "--store", str(store)])
    assert few.exit_code == 2 and "fewer than 3 nights" in few.output
    trend.trend_add(runs[2:3], store)
    result = runner.invoke(cli, ["compare", str(runs[0]), str(runs[3]), "--store", str(store)])
    assert "the trend store's night-to-night noise over 3 nights" in result.output, result.output
    assert result.exit_code in (0, 3)


def test_a_run_that_fails_more_everywhere_is_slower(baseline: analysis.Run, tmp_path: Path) -> None:
    # A quarter of B's requests time out in every cell, the medians hardly move: each
    # cell's own test cannot tell after Holm (8 sessions), the run-wide one can.
    repeat = _repeat(tmp_path)
    rng = np.random.default_rng(5)
    hit = pl.Series(rng.random(repeat.requests.height) < 0.25)
    broken = repeat.requests.with_columns(
        status=pl.when(hit).then(pl.lit("timeout")).otherwise(pl.col("status"))
    )
    result = analysis.compare_runs(baseline, replace(repeat, requests=broken), run_noise=QUIET)
    assert result.verdict == "slower" and result.exit_code == 1, result.to_text()
    assert "fails more (over the whole run)" in set(result.frame["why"])
