"""Cold first turns of a trace with a shared system prompt are compared.

Every first turn of such a trace but the very first shares the system prompt's blocks
with an earlier request; counting only those that share nothing left one session, and
"Cold first turns not compared (as few as 1 sessions)" on every such trace.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.fidelity import cold_check_limit, common_prefix_blocks
from tests.support.synthetic import SyntheticSpec, write_run

SYSTEM_BLOCKS = 2


def trace_run(tmp_path: Path, *, document: int = 0, sequential: bool = True) -> Path:
    """Eight sessions as a trace with a 2-block system prompt: session 0's first turn
    shares nothing, the others' share the prompt, the first ``document`` sessions after
    session 0 also a 6-block document; later turns share their session's prefix."""
    run_dir = write_run(tmp_path, SyntheticSpec(sessions=8, turns=3, placements=("alternate",)))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["sessions"]["source"] = "trace"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    path = run_dir / "requests.parquet"
    s, turn = pl.col("session_index"), pl.col("turn")
    first = (
        pl.when(s == 0).then(0).when(s <= document).then(SYSTEM_BLOCKS + 6).otherwise(SYSTEM_BLOCKS)
    )
    shared = pl.when(turn == 1).then(first).otherwise(SYSTEM_BLOCKS + 4 * turn)
    rows = pl.read_parquet(path)
    rows = rows.with_columns(trace_shared_blocks=shared.cast(pl.Int32))
    if sequential:  # each request sent after the one before it ended: none queued
        rows = rows.with_columns(send_s=(pl.col("e2e_s").cum_sum() - pl.col("e2e_s")))
    rows.write_parquet(path)
    return run_dir


def test_first_turns_sharing_only_the_system_prompt_are_cold(tmp_path: Path) -> None:
    run = analysis.load_run(trace_run(tmp_path))
    assert run.trace and common_prefix_blocks(run) == SYSTEM_BLOCKS
    cold = analysis.cold_turn_asymmetry(run)
    assert cold["n_units"].to_list() == [8] and cold["checked"].to_list() == [True]
    assert cold_check_limit(cold) is None


def test_first_turns_that_share_more_than_most_are_not_cold(tmp_path: Path) -> None:
    run = analysis.load_run(trace_run(tmp_path, document=2))  # sessions 1 and 2: a document
    assert common_prefix_blocks(run) == SYSTEM_BLOCKS
    assert analysis.cold_turn_asymmetry(run)["n_units"].to_list() == [6]


def test_the_limit_counts_one_session_in_the_singular(tmp_path: Path) -> None:
    run = analysis.load_run(trace_run(tmp_path, document=7))  # most share a document
    cold = analysis.cold_turn_asymmetry(run)
    assert common_prefix_blocks(run) == SYSTEM_BLOCKS + 6
    assert cold["n_units"].to_list() == [8]  # the shared document is the common prefix
    few = cold.with_columns(n_units=pl.lit(1), checked=pl.lit(False))
    assert "(as few as 1 session; 5 needed)" in (cold_check_limit(few) or "")


def test_a_simulator_judges_cold_turns_on_its_own_ttft(tmp_path: Path) -> None:
    """Client lag on a busy machine that slows one arm's cold turns is measurement error
    when the simulator's own TTFTs agree; without them it is a difference of the arms."""
    spec = SyntheticSpec(sessions=8, turns=2, placements=("fixed",), noise_sigma=0.02)
    run = analysis.load_run(write_run(tmp_path, spec))
    assert run.simulated
    lagged = pl.when((pl.col("cache") == "on") & (pl.col("turn") == 1))
    slow = lagged.then(pl.col("ttft_s") * 2.0).otherwise(pl.col("ttft_s"))
    client_only = dataclasses.replace(run, requests=run.requests.with_columns(ttft_s=slow))
    assert analysis.cold_turn_asymmetry(client_only)["flagged"].to_list() == [True]
    both = run.requests.with_columns(server_ttft_s=pl.col("ttft_s"), ttft_s=slow)
    modeled = dataclasses.replace(run, requests=both)
    assert analysis.cold_turn_asymmetry(modeled)["flagged"].to_list() == [False]
    assert not any("cold first turns" in w for w in analysis.trust_warnings(modeled))
    assert any("measurement error" in w for w in analysis.trust_warnings(modeled))


def test_first_turns_that_queued_are_not_compared(tmp_path: Path) -> None:
    """Open-loop arrivals: a first turn sent while another request ran on its replica
    waited as long as that arm's queue, which the pool shortens; the arms' cold turns
    then differ by the cache's own effect and are not compared."""
    run = analysis.load_run(trace_run(tmp_path, sequential=False))  # the spec's overlaps
    cold = analysis.cold_turn_asymmetry(run)
    assert cold["queued"].to_list() == [True] and cold["checked"].to_list() == [False]
    assert cold["flagged"].to_list() == [False]
    assert "waited behind other requests" in (cold_check_limit(cold) or "")


def test_ran_alone_reads_overlap_per_replica_and_block() -> None:
    from sessiongen.analysis.fidelity import ran_alone

    rows = pl.DataFrame(
        {
            "block": [0, 0, 0, 0, 1],
            "replica": [0, 0, 0, 1, 0],
            "session_id": ["a", "b", "c", "d", "e"],
            "turn": [1, 1, 1, 1, 1],
            "send_s": [0.0, 3.0, 0.5, 0.5, 0.5],
            "ttft_s": [1.0, 1.0, 0.2, 1.0, 1.0],
            "e2e_s": [2.0, 1.5, 0.3, 2.0, 2.0],
        }
    )
    # a and c overlap on replica 0; b comes after both ended; d is on replica 1; e in
    # another block
    assert ran_alone(rows, rows).to_list() == [False, True, False, True, True]
    # b sent after a's first token, before a ended: a had its first token alone, b did not
    later = rows.with_columns(send_s=pl.Series([0.0, 1.5, 9.0, 9.0, 9.0]))
    assert ran_alone(later, later.head(2)).to_list() == [True, False]
