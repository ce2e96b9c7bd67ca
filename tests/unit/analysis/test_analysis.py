"""Analysis frames on synthetic runs with planted effects (the truth is known)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from sessiongen import analysis
from sessiongen.errors import RunDirError
from tests.support.synthetic import SyntheticSpec, expected_speedup, with_changes, write_run

CLEAN = SyntheticSpec()
FAULTY = with_changes(
    CLEAN,
    contaminate=True,
    drift=1.5,
    drift_placement="fixed",
    failing_sessions=2,
    probe="needle",
    needle_wrong=3,
    diverge=2,
)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> analysis.Run:
    return analysis.load_run(write_run(tmp_path_factory.mktemp("clean"), CLEAN))


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> analysis.Run:
    return analysis.load_run(write_run(tmp_path_factory.mktemp("faulty"), FAULTY))


def _load(tmp_path: Path, spec: SyntheticSpec) -> analysis.Run:
    return analysis.load_run(write_run(tmp_path, spec))


def test_load_converts_to_modeled_seconds_and_drops_warmup(clean: analysis.Run) -> None:
    raw = pl.read_parquet(clean.path / "requests.parquet")
    kept = raw.filter(~pl.col("warmup"))
    assert clean.warmup_rows == raw.height - kept.height == 16
    assert clean.requests.height == kept.height
    assert clean.requests["ttft_s"].to_list() == pytest.approx(
        (kept["ttft_s"] / CLEAN.time_scale).to_list()
    )
    assert clean.requests["ttft_s"].max() < 50  # the warm-up rows' 100 s are gone
    assert clean.simulated and clean.target_label.startswith("SIMULATED")


def test_load_rejects_bad_run_folders(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="no manifest"):
        analysis.load_run(tmp_path)
    run_dir = write_run(tmp_path, CLEAN)
    pl.read_parquet(run_dir / "requests.parquet").drop("ttft_s").write_parquet(
        run_dir / "requests.parquet"
    )
    with pytest.raises(RunDirError, match="missing columns: ttft_s"):
        analysis.load_run(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["target"]["time_scale"] = 0
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunDirError):
        analysis.load_run(run_dir)


def test_speedup_recovers_planted_truth(clean: analysis.Run) -> None:
    table = analysis.speedup_table(clean)
    assert table.height == 12 and table["paired"].all()
    covered = 0
    for row in table.iter_rows(named=True):
        truth = expected_speedup(CLEAN, row["placement"], row["turn"])
        assert row["speedup"] == pytest.approx(truth, rel=0.15), row
        covered += row["speedup_ci_low"] <= truth <= row["speedup_ci_high"]
    assert covered >= 10, covered


def test_pairing_narrows_intervals_and_falls_back_to_independent(clean: analysis.Run) -> None:
    paired = analysis.speedup_table(clean)
    # Drop half the sessions from the ON arm: the arms no longer hold the same sessions.
    partial = clean.filter((pl.col("cache") == "off") | (pl.col("session_index") < 4))
    independent = analysis.speedup_table(partial)
    assert not independent["paired"].any()
    width = (pl.col("speedup_ci_high") - pl.col("speedup_ci_low")).median()
    assert paired.select(width).item() < independent.select(width).item()
    alt = independent.filter(pl.col("placement") == "alternate", pl.col("turn") > 1)
    assert alt["speedup"].to_list() == pytest.approx([4.0] * 5, rel=0.35)


def test_intervals_are_reproducible_and_seeded(clean: analysis.Run) -> None:
    a = analysis.arm_turn_table(clean)
    assert a.equals(analysis.arm_turn_table(clean))
    other = analysis.arm_turn_table(clean, boot=analysis.Bootstrap(seed=1))
    assert not a["ci_low_s"].equals(other["ci_low_s"])
    assert (a["ci_low_s"] <= a["median_ttft_s"]).all()
    assert (a["median_ttft_s"] <= a["ci_high_s"]).all()


def test_errors_are_counted_and_excluded(faulty: analysis.Run) -> None:
    table = analysis.arm_turn_table(faulty).filter(
        pl.col("placement") == "alternate", pl.col("cache") == "on"
    )
    by_turn = {r["turn"]: (r["n"], r["errors"]) for r in table.iter_rows(named=True)}
    assert by_turn[2] == (16, 0)
    assert by_turn[3] == (14, 2)  # the failing sessions' turn 3
    assert by_turn[4] == (14, 0)  # they stopped: no later turns
    totals = analysis.session_totals(faulty)
    assert totals.filter(~pl.col("complete")).height == 2


def test_contamination_detected_when_planted_only(
    clean: analysis.Run, faulty: analysis.Run, tmp_path: Path
) -> None:
    assert analysis.contamination(clean).is_empty()
    found = analysis.contamination(faulty)
    assert sorted(found["reason"].to_list()) == [
        "cold first turn hit > 0 tokens",
        "cold first turn hit > 0 tokens",
        "external hit with cache off",
    ]
    assert analysis.arm_turn_table(faulty)["contamination"].sum() == 3
    shared = _load(tmp_path, with_changes(CLEAN, shared_prefix_tokens=512))
    assert (
        analysis.cache_attribution(shared).filter(pl.col("turn") == 1)["cached_tokens"].min() == 512
    )
    assert analysis.contamination(shared).is_empty()  # the shared prefix is allowed


def test_cross_replica_and_cold_turns(clean: analysis.Run) -> None:
    split = analysis.cross_vs_same(clean)
    assert split.filter(pl.col("placement") == "alternate")["cross_replica"].all()
    assert not split.filter(pl.col("placement") == "fixed")["cross_replica"].any()
    assert split["turn"].min() == 2
    cold = analysis.cold_first_turns(clean)
    assert cold.height == 4 and (cold["max_cached_tokens"] == 0).all()


def test_correctness_needles_and_divergence(clean: analysis.Run, faulty: analysis.Run) -> None:
    assert analysis.needle_grades(clean).is_empty()
    grades = analysis.needle_grades(faulty).filter(pl.col("rate") < 1)
    assert grades.select("placement", "cache", "turn", "correct", "graded").rows() == [
        ("alternate", "on", 6, 11, 14)
    ]
    assert analysis.divergence_counts(clean)["diverged"].sum() == 0
    counts = analysis.divergence_counts(faulty).filter(pl.col("diverged") > 0)
    columns = ("placement", "turn", "diverged", "ids_differ", "logprob_beyond_tol")
    assert counts.select(columns).rows() == [("alternate", 4, 2, 2, 2)]
    assert counts["max_logprob_diff"].item() > 1.0
    # Against OFF on the same prompt: the needles ON missed where OFF was right are cache
    # failures; outputs that differ outside an equivalence run are not.
    verdicts = analysis.correctness(faulty)
    assert (verdicts.needles.failures, verdicts.cache_failures) == (3, 3)
    assert verdicts.needles.verdict == "cache failure"
    assert verdicts.equivalence.failures == 2


def test_session_speedup_counts_complete_sessions(faulty: analysis.Run) -> None:
    table = analysis.session_speedup(faulty)
    alt = table.filter(pl.col("placement") == "alternate").row(0, named=True)
    assert (alt["n_off"], alt["n_on"]) == (16, 14)
    assert alt["speedup_ci_low"] <= alt["speedup"] <= alt["speedup_ci_high"]
    assert alt["speedup"] > 1.3


def test_run_summary_shape_and_speedup_on_rows_only(faulty: analysis.Run) -> None:
    summary = analysis.run_summary(faulty)
    assert summary.columns[:4] == ["placement", "cache", "context_tokens", "turn"]
    assert {"n", "errors", "median_ttft_s", "contamination", "divergences"} <= set(summary.columns)
    assert summary.height == 24
    assert summary.filter(pl.col("cache") == "off")["speedup"].null_count() == 12
    on = summary.filter(pl.col("cache") == "on").sort("placement", "turn")
    speed = analysis.speedup_table(faulty).sort("placement", "turn")
    assert on["speedup"].to_list() == speed["speedup"].to_list()
    assert summary["divergences"].sum() == 2  # 2 ON answers, on the ON row
    assert summary["cache_failures"].sum() == 3  # the needles (divergences: not this probe)
    assert summary.filter(pl.col("cache") == "off")["cache_failures"].sum() == 0


def test_multiple_context_sizes_are_kept_apart(tmp_path: Path) -> None:
    run = _load(tmp_path, with_changes(CLEAN, contexts=(8192, 32768), placements=("alternate",)))
    table = analysis.speedup_table(run)
    assert sorted(table["context_tokens"].unique().to_list()) == [8192, 32768]
    assert "context_tokens" in analysis.drop_single_context(table).columns
    text = analysis.console_table(run)
    assert "context 8192 tokens" in text and "context 32768 tokens" in text


def test_console_table(clean: analysis.Run) -> None:
    text = analysis.console_table(clean)
    lines = text.splitlines()
    assert "modeled seconds" in lines[0] and "SIMULATED" in lines[0]
    assert lines[1].split() == ["turn", "alternate", "off", "alternate", "on", "speedup",
                                "fixed", "off", "fixed", "on", "speedup"]  # fmt: skip
    assert len(lines) == 2 + CLEAN.turns
    turn2 = lines[3].split()
    assert turn2[0] == "2" and 3.4 < float(turn2[3].rstrip("x")) < 4.6


def test_latest_run(tmp_path: Path) -> None:
    with pytest.raises(RunDirError):
        analysis.latest_run(tmp_path)
    write_run(tmp_path, CLEAN)
    newer = write_run(tmp_path, with_changes(CLEAN, started=CLEAN.started.replace(hour=18)))
    assert analysis.latest_run(tmp_path) == newer


def test_resolve_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = write_run(tmp_path / "runs", CLEAN)
    nested = tmp_path / "notebooks"
    nested.mkdir()
    monkeypatch.delenv("SESSIONGEN_RUN", raising=False)
    assert analysis.resolve_run_dir(start=nested) == run_dir
    monkeypatch.setenv("SESSIONGEN_RUN", "/somewhere/else")
    assert analysis.resolve_run_dir(start=nested) == Path("/somewhere/else")
    assert analysis.resolve_run_dir(run_dir, start=nested) == run_dir
    monkeypatch.delenv("SESSIONGEN_RUN")
    with pytest.raises(RunDirError, match="no runs/ folder"):
        analysis.resolve_run_dir(start=Path("/"))
