"""Correctness against the cache on synthetic runs: verdicts, needles, prompt keys, evidence.

The synthetic writer's truth: every prompt (block salt, session, turn) has one answer and
every needle is answered right, unless planted otherwise; ON requests on cross-replica
turns of ``alternate`` carry external hits.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from sessiongen import analysis
from sessiongen.analysis.correctness import (
    CACHE_FAILURE,
    NOT_EXERCISED,
    OFF_INCONSISTENT,
    PASSED,
    VACUOUS,
    WITHIN_NOISE,
    verdict,
)
from sessiongen.analysis.prompts import BASIS_DIGEST, BASIS_SESSION, keyed_requests
from sessiongen.client.counters import EXTERNAL_HITS
from sessiongen.records.format import METRICS_SCHEMA
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

NEEDLE = SyntheticSpec(probe="needle", placements=("alternate",), sessions=4, turns=6)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"failures": 1, "off_inconsistent": 3, "exercised": 0, "vacuous": True}, CACHE_FAILURE),
        ({"failures": 0, "off_inconsistent": 3, "exercised": 9, "vacuous": True}, VACUOUS),
        (
            {"failures": 0, "off_inconsistent": 1, "exercised": 9, "vacuous": False},
            OFF_INCONSISTENT,
        ),
        (
            {"failures": 0, "off_inconsistent": 1, "exercised": 0, "vacuous": False},
            OFF_INCONSISTENT,
        ),
        ({"failures": 0, "off_inconsistent": 0, "exercised": 0, "vacuous": False}, NOT_EXERCISED),
        ({"failures": 0, "off_inconsistent": 0, "exercised": 1, "vacuous": False}, PASSED),
        (
            {
                "failures": 0,
                "off_inconsistent": 0,
                "exercised": 1,
                "vacuous": False,
                "pool_diverged": 1,
            },
            WITHIN_NOISE,
        ),
    ],
)
def test_verdict_precedence(counts: dict[str, int], expected: str) -> None:
    assert verdict(**counts) == expected


def test_needles_missed_in_on_where_off_was_right_are_cache_failures(tmp_path: Path) -> None:
    # Every session misses its turn-6 needle in the first ON block, served by the pool:
    # 4 of 40 pool-served answers wrong against 0 of 56 (turn-1 ON and OFF answers).
    run = analysis.load_run(write_run(tmp_path, with_changes(NEEDLE, needle_wrong=4)))
    verdicts = analysis.correctness(run)
    n = verdicts.needles
    assert (n.graded, n.compared, n.failures, n.off_wrong, n.on_only) == (48, 48, 4, 0, 0)
    assert n.exercised == 2 * 4 * 5 and n.evidence == "request"  # ON blocks x sessions x turns 2-6
    assert (n.baseline.base_compared, n.baseline.base_diverged) == (8 + 48, 0)
    assert verdicts.cache_failures == 4 and n.verdict == CACHE_FAILURE
    line = verdicts.failure_line()
    assert line is not None and line.startswith(
        "cache failures: 4 pool-served needle answers wrong in the ON arm where the OFF arm "
        "answered the same prompt right: 4 of 40 pool-served answers differ from OFF, "
        "against 0 of 56"
    )
    cells = analysis.correctness_cells(run).filter(pl.col("cache_failures") > 0)
    assert cells.select("cache", "turn", "cache_failures").rows() == [("on", 6, 4)]


def test_a_needle_miss_within_the_noise_is_not_a_cache_failure(tmp_path: Path) -> None:
    # One miss among 40 pool-served answers (p = 0.32 against a clean 56) failed the run.
    run = analysis.load_run(write_run(tmp_path, with_changes(NEEDLE, needle_wrong=1)))
    verdicts = analysis.correctness(run)
    assert (verdicts.needles.wrong, verdicts.needles.failures) == (1, 0)
    assert verdicts.needles.verdict == WITHIN_NOISE and verdicts.cache_failures == 0
    cells = analysis.correctness_cells(run)
    assert cells["cache_failures"].sum() == 0 and cells["pool_divergences"].sum() == 1


def test_needles_missed_with_the_cache_off_are_a_model_limit(tmp_path: Path) -> None:
    spec = with_changes(NEEDLE, needle_off_wrong=1, needle_wrong=0)
    run = analysis.load_run(write_run(tmp_path, spec))
    verdicts = analysis.correctness(run)
    n = verdicts.needles
    assert (n.failures, n.off_wrong, n.compared, n.verdict) == (0, 1, 46, OFF_INCONSISTENT)
    assert verdicts.failure_line() is None
    cells = analysis.correctness_cells(run).filter(pl.col("off_inconsistent") > 0)
    assert cells.select("cache", "turn", "off_inconsistent").rows() == [("off", 5, 1)]
    line = verdicts.verdict_line()
    assert line is not None and line.startswith("correctness: needles OFF inconsistent")


def test_needles_missed_with_no_off_answer_are_on_only(tmp_path: Path) -> None:
    spec = with_changes(NEEDLE, blocks=("on", "on"), needle_wrong=1)
    run = analysis.load_run(write_run(tmp_path, spec))
    n = analysis.correctness(run).needles
    assert (n.failures, n.on_only, n.compared, n.verdict) == (0, 1, 0, NOT_EXERCISED)
    assert analysis.run_summary(run)["on_only"].sum() == 1


def test_prompt_keys_are_digests_and_sessions_do_not_match_across_salts(tmp_path: Path) -> None:
    spec = with_changes(NEEDLE, block_salts=True)
    keys = keyed_requests(analysis.load_run(write_run(tmp_path, spec)))
    assert (keys.basis, keys.unkeyed) == (BASIS_DIGEST, 0)
    per_session = keys.rows.group_by("session_id", "turn").agg(pl.col("prompt_key").n_unique())
    assert (per_session["prompt_key"] == 4).all()  # four blocks, four prompts


def _set_history(run_dir: Path, history: str) -> None:
    path = run_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["scenario"]["sessions"]["history"] = history
    path.write_text(json.dumps(manifest))


def test_schema_1_live_history_matches_first_turns_only(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, with_changes(NEEDLE, schema_version=1, turns=3))
    _set_history(run_dir, "live")  # later turns carry the server's own answers
    keys = keyed_requests(analysis.load_run(run_dir))
    assert keys.basis == BASIS_SESSION
    assert keys.unkeyed == keys.rows.filter(pl.col("turn") > 1).height
    n = analysis.correctness(analysis.load_run(run_dir)).needles
    assert n.compared == 2 * 4  # turn 1 of each session in both ON blocks


def _metrics(run_dir: Path, on_hits: float) -> None:
    """Block counters: external hits rise by ``on_hits`` per replica in ON blocks."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    rows = []
    for b in manifest["blocks"]:
        for replica in (0, 1):
            for moment, value in (("before", 0.0), ("after", on_hits if b["cache"] == "on" else 0)):
                rows.append(
                    dict(
                        run_id=manifest["run_id"],
                        block=b["block"],
                        placement=b["placement"],
                        cache=b["cache"],
                        replica=replica,
                        moment=moment,
                        metric=EXTERNAL_HITS,
                        value=float(value),
                    )
                )
    pl.DataFrame(rows, schema=METRICS_SCHEMA).write_parquet(run_dir / "metrics.parquet")


@pytest.mark.parametrize(("on_hits", "served"), [(3136.0, 2 * 4 * 2), (0.0, 0)])
def test_without_per_request_counts_block_counters_say_what_the_pool_served(
    tmp_path: Path, on_hits: float, served: int
) -> None:
    spec = SyntheticSpec(probe="equivalence", placements=("alternate",), sessions=4, turns=3)
    run_dir = write_run(tmp_path, spec)
    path = run_dir / "requests.parquet"
    frame = pl.read_parquet(path).with_columns(external_hit_tokens=pl.lit(None, pl.Int64))
    frame.write_parquet(path)  # concurrency > 1: no exact per-request counts
    _metrics(run_dir, on_hits)
    rows = keyed_requests(analysis.load_run(run_dir)).rows
    assert set(rows["pool_evidence"]) == {"block"}
    assert rows["pool_served"].sum() == served
    assert not rows.filter(pl.col("cache") == "off")["pool_served"].any()
    assert not rows.filter(~pl.col("cross_replica"))["pool_served"].any()
    eq = analysis.equivalence(analysis.load_run(run_dir))
    assert (eq.exercised, eq.evidence) == (served, "block")
    assert eq.verdict == (PASSED if served else NOT_EXERCISED)


def _deepest_parenthesis(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        deepest = max(deepest, depth)
        assert depth >= 0, text
    assert depth == 0, text
    return deepest


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"blocks": ("on", "on")}, "no OFF arm"),
        ({"block_salts": True}, "no prompt was sent in both arms"),
        ({"placements": ("fixed",)}, "was served from the shared pool"),
    ],
)
def test_a_probe_not_exercised_says_why_in_one_level_of_parentheses(
    tmp_path: Path, changes: dict[str, object], reason: str
) -> None:
    run = analysis.load_run(write_run(tmp_path, with_changes(NEEDLE, **changes)))
    verdicts = analysis.correctness(run)
    line = verdicts.verdict_line()
    assert verdicts.needles.verdict == NOT_EXERCISED and line is not None
    assert line.startswith("correctness: needles not exercised (") and reason in line, line
    assert _deepest_parenthesis(line) == 1, line
