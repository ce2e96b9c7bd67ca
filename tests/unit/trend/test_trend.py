"""The trend store, the regression check and the trend plots, on histories with known truth."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from sessiongen import analysis, trend
from sessiongen.errors import RunDirError, UserError
from sessiongen.records import io as records
from sessiongen.records.meta import RunMeta
from sessiongen.trend import check as tcheck
from sessiongen.trend import store as tstore
from tests.support.synthetic import SyntheticSpec, write_run
from tests.support.trend_history import (
    SUMMARY_SCHEMA,
    Night,
    history_frame,
    night_label,
    write_history,
)

FLAT = Night()
SLOW = Night(ttft={("alternate", "on", 2): 1.3}, versions={"sim.slowdown": "1.3"})
SMALL_RUN = SyntheticSpec(name="tiny", placements=("alternate",), sessions=4, turns=2)


# --- store -------------------------------------------------------------------------------


def test_add_stores_one_file_per_run_and_twice_is_a_no_op(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", SMALL_RUN)
    store = tmp_path / "store"
    [path] = trend.trend_add([run_dir], store)
    manifest = records.read_manifest(run_dir)
    assert path == store / f"tiny-{manifest['scenario_digest']}" / f"{run_dir.name}.parquet"
    stamp = path.stat().st_mtime_ns
    assert trend.trend_add([run_dir], store) == []
    assert path.stat().st_mtime_ns == stamp
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left

    stored = pl.read_parquet(path)
    summary = analysis.run_summary(analysis.load_run(run_dir))
    assert stored.select(summary.columns).equals(summary)
    row = stored.row(0, named=True)
    assert row["run_id"] == run_dir.name and row["target_kind"] == "sim"
    assert row["night"] == "2026-11-30" and row["store_version"] == trend.STORE_VERSION
    assert json.loads(row["versions"])["sim.slowdown"] == "1.0"


def test_synthetic_history_has_the_columns_of_a_real_summary(tmp_path: Path) -> None:
    real = analysis.run_summary(analysis.load_run(write_run(tmp_path, SMALL_RUN)))
    assert dict(real.schema) == SUMMARY_SCHEMA


def test_different_scenarios_are_kept_apart(tmp_path: Path) -> None:
    store = tmp_path / "store"
    a = write_run(tmp_path / "runs", SMALL_RUN)
    b = write_run(
        tmp_path / "runs",
        SyntheticSpec(name="tiny", placements=("alternate",), sessions=4, turns=3),
        run_id="20261130T150000Z-tiny-b",
    )
    trend.trend_add([a, b], store)
    assert len(list(store.iterdir())) == 2  # same name, different digest
    write_history(store, [FLAT] * 6 + [SLOW] * 2, name="other")
    result = trend.trend_check(store)
    assert set(result.groups) == {f"{p.name} [sim]" for p in store.iterdir()}
    assert set(result.regressions["folder"].to_list()) == {"other-other-digest"}
    only = trend.trend_check(
        store, folders=[a_folder := f"tiny-{records.read_manifest(a)['scenario_digest']}"]
    )
    assert list(only.groups) == [f"{a_folder} [sim]"] and only.findings.is_empty()
    with pytest.raises(UserError, match="no runs in the trend store for nope"):
        trend.trend_check(store, folders=["nope"])


def test_incomplete_or_missing_runs_add_nothing(tmp_path: Path) -> None:
    good = write_run(tmp_path / "runs", SMALL_RUN)
    bad = write_run(
        tmp_path / "runs",
        SyntheticSpec(name="tiny", placements=("alternate",), sessions=4, turns=2, seed=1),
    )
    manifest = records.read_manifest(bad)
    records.write_manifest(bad, {**manifest, "complete": False})
    with pytest.raises(RunDirError, match="incomplete"):
        trend.trend_add([good, bad], tmp_path / "store")
    with pytest.raises(RunDirError, match="no manifest"):
        trend.trend_add([tmp_path / "nope"], tmp_path / "store")
    assert not (tmp_path / "store").exists()
    with pytest.raises(UserError, match="no runs"):
        trend.trend_check(tmp_path / "store")


def test_versions_of_sim_and_endpoint_manifests() -> None:
    sim = {
        "tool": {"sessiongen_version": "0.1.0", "git_sha": "0123456789abcdef"},
        "target": {"kind": "sim", "profile": {"slowdown": 1.3, "replicas": 2}},
    }
    assert tstore.versions_of(RunMeta.from_manifest(sim)) == {
        "sessiongen": "0.1.0",
        "git_sha": "0123456789ab",
        "target": "sim",
        "sim.slowdown": "1.3",
        "sim.replicas": "2",
    }
    real = {
        "tool": {"sessiongen_version": "0.1.0", "git_sha": None},
        "target": {"kind": "endpoints", "servers": [{"url": "u", "version": {"version": "0.9.1"}}]},
    }
    assert tstore.versions_of(RunMeta.from_manifest(real))["servers.0.version.version"] == "0.9.1"
    assert tstore.changed_versions({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "x"}) == (
        "b: 2 -> 3; c: - -> x"
    )


# --- check -------------------------------------------------------------------------------


def test_flat_history_has_no_findings(tmp_path: Path) -> None:
    write_history(tmp_path, [FLAT] * 12)
    result = trend.trend_check(tmp_path)
    assert result.findings.is_empty() and result.exit_code == 0
    assert result.series == 2 * 3 * 2 + 2 * 3  # ttft per arm and turn, speedup per turn
    assert "0 regressions" in result.table()


def test_no_false_alarms_on_flat_histories_over_many_seeds() -> None:
    # 200 seeded histories of 10 nights with 5% night noise, 6 series each (1,200 series).
    # Each series alarms with probability ~0.1% at the default penalty (tests/test_stepdetect.py
    # measured 0 of 4,500 flat fits splitting), so more than 3 alarms here would be a change in
    # the method (P(>3 | 0.1%) < 0.04), not bad luck.
    alarms = []
    for seed in range(200):
        groups = tcheck.check_groups(history_frame([FLAT] * 10, seed))
        alarms += [(seed, s.cell) for _n, series, _c in groups for s in series if s.finding]
    assert len(alarms) <= 3, alarms


def test_planted_slowdown_is_a_regression_at_the_right_night(tmp_path: Path) -> None:
    write_history(tmp_path, [FLAT] * 8 + [SLOW] * 3, seed=0)
    result = trend.trend_check(tmp_path)
    assert result.exit_code == 1
    [row] = result.regressions.iter_rows(named=True)
    cell = (row["metric"], row["placement"], row["cache"], row["turn"])
    assert cell == ("ttft", "alternate", "on", 2)
    assert row["started"] == night_label(8) and row["nights"] == 3
    assert row["started_run"] == f"{night_label(8).replace('-', '')}T020000Z-nightly-0008"
    assert row["change"] == pytest.approx(0.3, abs=0.05)
    assert row["versions_changed"] == "sim.slowdown: 1.0 -> 1.3"
    assert "REGRESSION" in result.table() and "since " + night_label(8) in result.table()
    assert "sim.slowdown: 1.0 -> 1.3" in result.markdown()


def test_planted_slowdown_is_found_over_seeds() -> None:
    # A 30% step (5 sigma of night noise) seen for 3 nights: the fit finds it at the
    # right night nearly always; a miss needs two of the three nights far below the truth.
    found = []
    for seed in range(20):
        groups = tcheck.check_groups(history_frame([FLAT] * 8 + [SLOW] * 3, seed))
        hits = [s.finding for _n, series, _c in groups for s in series if s.finding]
        assert all(h["started"] == night_label(8) for h in hits), (seed, hits)
        found.append(len(hits) == 1 and hits[0]["kind"] == "regression")
    assert sum(found) >= 18, found


def test_speedup_drop_is_a_regression_and_a_rise_an_improvement(tmp_path: Path) -> None:
    drop = Night(speedup={("alternate", "on", 3): 0.7})
    write_history(tmp_path / "a", [FLAT] * 8 + [drop] * 2, seed=1)
    [row] = trend.trend_check(tmp_path / "a").findings.iter_rows(named=True)
    assert (row["kind"], row["metric"], row["turn"]) == ("regression", "speedup", 3)
    assert row["cache"] is None and row["change"] == pytest.approx(-0.3, abs=0.06)

    rise = Night(speedup={("alternate", "on", 3): 1.5})
    write_history(tmp_path / "b", [FLAT] * 8 + [rise] * 2, seed=1)
    result = trend.trend_check(tmp_path / "b")
    assert result.exit_code == 0 and result.improvements.height == 1
    assert "IMPROVEMENT" in result.table()


def test_a_shift_must_persist_for_min_nights(tmp_path: Path) -> None:
    write_history(tmp_path, [FLAT] * 8 + [SLOW], seed=2)
    assert trend.trend_check(tmp_path).findings.is_empty()  # one night: an outlier so far
    write_history(tmp_path, [SLOW], seed=2, first=9)
    assert trend.trend_check(tmp_path).exit_code == 1
    assert trend.trend_check(tmp_path, min_nights=3).findings.is_empty()
    assert trend.trend_check(tmp_path, min_nights=1).exit_code == 1


def test_thresholds_per_metric(tmp_path: Path) -> None:
    quiet = Night(noise=0.005)
    small = Night(noise=0.005, ttft={("fixed", "off", 2): 1.04})
    write_history(tmp_path, [quiet] * 8 + [small] * 3)
    assert trend.trend_check(tmp_path).findings.is_empty()  # 4% < 5%
    tight = trend.trend_check(tmp_path, per_metric_thresholds={"ttft": 0.03})
    assert tight.regressions.height == 1
    assert trend.trend_check(
        tmp_path, threshold=0.03, per_metric_thresholds={"ttft": 0.1}
    ).findings.is_empty()
    with pytest.raises(UserError, match="unknown metric 'p99'"):
        trend.trend_check(tmp_path, per_metric_thresholds={"p99": 0.1})
    with pytest.raises(UserError, match="expected a number > 0"):
        trend.trend_check(tmp_path, threshold=0)
    with pytest.raises(UserError, match="min_nights"):
        trend.trend_check(tmp_path, min_nights=0)


def test_cache_failures_and_contamination_are_regressions_at_any_size(tmp_path: Path) -> None:
    night = Night(versions={"sessiongen": "0.2.0"}, cache_failures=1, contamination=1)
    write_history(tmp_path, [FLAT] * 5 + [night])
    result = trend.trend_check(tmp_path)
    found = {r["metric"]: r for r in result.regressions.iter_rows(named=True)}
    assert set(found) == {"cache_failures", "contamination"} and result.exit_code == 1
    assert (
        found["cache_failures"]["nights"] == 1 and found["cache_failures"]["after"] == 2
    )  # 2 placements
    assert found["cache_failures"]["versions_changed"] == "sessiongen: 0.1.0 -> 0.2.0"
    assert "alternate/on 32768 t2: 1" in found["cache_failures"]["detail"]
    assert "alternate/off 32768 t1: 1" in found["contamination"]["detail"]
    assert "any size" in result.table()


def test_what_the_off_arm_gets_wrong_is_not_a_regression(tmp_path: Path) -> None:
    # OFF answers that disagree, OFF needles missed, raw divergences: the model's limits.
    night = Night(off_inconsistent=2, needle_off_wrong=3, needle_wrong=3, divergences=1)
    write_history(tmp_path, [FLAT] * 5 + [night])
    assert trend.trend_check(tmp_path).findings.is_empty()


def test_stores_without_cache_failures_fall_back_to_what_is_safe(tmp_path: Path) -> None:
    old = Night(legacy=True)
    # Divergences in cells with both arms, ON needles wrong where OFF was right: failures.
    write_history(tmp_path / "a", [old] * 5 + [Night(legacy=True, divergences=1, needle_wrong=2)])
    [row] = trend.trend_check(tmp_path / "a").regressions.iter_rows(named=True)
    assert row["metric"] == "cache_failures" and row["after"] == 2 * (1 + 2)
    assert "store without cache_failures" in row["detail"]
    # Needles missed in both arms of a cell: a model limit, as in today's stores.
    both = Night(legacy=True, needle_wrong=2, needle_off_wrong=1)
    write_history(tmp_path / "b", [old] * 5 + [both])
    assert trend.trend_check(tmp_path / "b").findings.is_empty()
    # An old night, then a new one: each is read by its own columns.
    write_history(tmp_path / "a", [Night()], first=6)
    assert trend.trend_check(tmp_path / "a").regressions.is_empty()


def test_cache_failures_count_at_once_and_errors_must_persist(tmp_path: Path) -> None:
    write_history(tmp_path, [FLAT] * 5 + [Night(errors=4, cache_failures=1)])
    assert set(trend.trend_check(tmp_path).regressions["metric"]) == {"cache_failures"}
    write_history(tmp_path, [Night(errors=4)], first=6)
    [row] = trend.trend_check(tmp_path).regressions.iter_rows(named=True)
    assert (row["metric"], row["nights"], row["started"], row["after"]) == (
        "errors",
        2,
        night_label(5),
        8.0,
    )


def test_errors_at_their_usual_rate_never_alarm(tmp_path: Path) -> None:
    # Every night fails a few requests (a replica's occasional timeout): errors on each
    # of the newest nights alarmed every night. Only a rise above the earlier rate does.
    write_history(tmp_path, [Night(errors=2)] * 8)
    assert trend.trend_check(tmp_path).regressions.is_empty()
    write_history(tmp_path, [Night(errors=20)] * 2, first=8)
    [row] = trend.trend_check(tmp_path).regressions.iter_rows(named=True)
    assert (row["metric"], row["started"]) == ("errors", night_label(8))


def test_gaps_and_outliers(tmp_path: Path) -> None:
    gap = Night(missing=[("alternate", "on", 2)])
    wild = Night(ttft={("alternate", "on", 2): 2.5})  # one wild night
    history = [FLAT] * 3 + [gap, wild] + [FLAT] * 3 + [gap] + [FLAT] * 2
    write_history(tmp_path, history, seed=3)
    assert trend.trend_check(tmp_path).findings.is_empty()
    slower = Night(ttft={("alternate", "on", 2): 1.5}, versions={"sim.slowdown": "1.3"})
    write_history(tmp_path, [gap, slower, slower], seed=3, first=len(history))
    [row] = trend.trend_check(tmp_path).regressions.iter_rows(named=True)
    assert row["started"] == night_label(len(history) + 1) and row["nights"] == 2
    assert row["versions_changed"] == "sim.slowdown: 1.0 -> 1.3"


def test_window_limits_the_nights_checked(tmp_path: Path) -> None:
    write_history(tmp_path, [FLAT] * 4 + [SLOW] * 8, seed=5)
    assert trend.trend_check(tmp_path).exit_code == 1
    result = trend.trend_check(tmp_path, window=6)
    assert result.findings.is_empty() and list(result.groups.values()) == [6]


# --- plot --------------------------------------------------------------------------------


def test_plot_writes_one_png_per_headline_series(tmp_path: Path) -> None:
    write_history(tmp_path / "store", [FLAT] * 6 + [SLOW] * 2)
    paths = trend.trend_plot(tmp_path / "store", tmp_path / "plots")
    names = sorted(p.name for p in paths)
    assert names == [
        "speedup-alternate-32768.png",
        "speedup-fixed-32768.png",
        "ttft-alternate-32768.png",
        "ttft-fixed-32768.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
        assert path.parent.name == "nightly-nightly-digest-sim"


def test_runs_at_another_time_scale_form_their_own_series(tmp_path: Path) -> None:
    """A simulated run's measurement error scales with 1 / time scale: nights at another
    scale are never read as a change of the same series."""
    store = tmp_path / "store"
    fast = Night(versions={"sim.time_scale": "0.05"})
    slow = Night(versions={"sim.time_scale": "0.5"}, ttft={("*", "*", "*"): 1.3})
    write_history(store, [fast] * 6 + [slow] * 4)
    result = trend.trend_check(store)
    assert len(result.groups) == 2 and any("time scale 0.05" in k for k in result.groups)
    assert result.regressions.is_empty()  # 30% slower, but at another scale: not a change
    assert set(result.findings["time_scale"].to_list()) <= {0.05, 0.5}
