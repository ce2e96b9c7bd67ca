"""The routing analysis on synthetic runs: moved and known shares, the pool's gain, verdicts."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from sessiongen import analysis
from sessiongen.analysis.stats import Bootstrap
from sessiongen.records import io as records
from sessiongen.report import write_report
from sessiongen.report.routing import routing_section
from tests.support.synthetic import SyntheticSpec, write_run

BOOT = Bootstrap(n_resamples=400)

SPEC = SyntheticSpec(
    placements=("alternate", "fixed", "router:round_robin", "router:consistent_hash"),
    speedup={"alternate": 4.0, "fixed": 1.0, "router:round_robin": 3.0},
    sessions=6,
)


def route(requests: pl.DataFrame) -> pl.DataFrame:
    """Plant what routers did: round_robin moves every turn, but the replica of each
    session's turn 4 is unknown; consistent_hash keeps every session on one replica."""
    rr = pl.col("placement") == "router:round_robin"
    ch = pl.col("placement") == "router:consistent_hash"
    turn = pl.col("turn")
    unknown = rr & (turn == 4) & ~pl.col("warmup")
    out = requests.with_columns(
        replica=pl.when(unknown)
        .then(None)
        .when(rr)
        .then((turn + pl.col("session_index")) % 2)
        .otherwise(pl.col("replica")),
        replica_source=pl.when(unknown)
        .then(pl.lit("unknown"))
        .when(rr | ch)
        .then(pl.lit("header+counters"))
        .otherwise(pl.lit("placement")),
    )
    return out.with_columns(
        cross_replica=pl.when(rr & turn.is_in([4, 5]))
        .then(None)
        .when(rr)
        .then(turn > 1)
        .otherwise(pl.col("cross_replica"))
    )


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> analysis.Run:
    run_dir = write_run(tmp_path_factory.mktemp("routed"), SPEC)
    path = run_dir / "requests.parquet"
    records.atomic_write_parquet(path, route(pl.read_parquet(path)))
    return analysis.load_run(run_dir)


def test_moved_share_counts_only_turns_whose_replicas_are_known(routed: analysis.Run) -> None:
    moves = analysis.replica_moves(routed).filter(pl.col("cache") == "on")
    row = {r["placement"]: r for r in moves.iter_rows(named=True)}
    rr = row["router:round_robin"]
    per_block = SPEC.sessions * SPEC.turns
    assert rr["routed"] and rr["requests"] == 2 * per_block
    assert rr["known"] == rr["requests"] - 2 * SPEC.sessions  # turn 4 unknown
    # Turns 2, 3 and 6 are known transitions (turn 4 is unknown, so are 4 and 5).
    assert rr["transitions"] == rr["moved"] == 2 * SPEC.sessions * 3
    assert rr["moved_share"] == 1.0
    assert rr["sources"] == f"header+counters: {rr['known']}, unknown: {2 * SPEC.sessions}"
    assert row["router:consistent_hash"]["moved_share"] == 0.0
    assert row["alternate"]["moved_share"] == 1.0 and not row["alternate"]["routed"]
    assert row["fixed"]["sources"] == f"placement: {2 * per_block}"


def test_headline_gives_gains_and_whether_they_survive(routed: analysis.Run) -> None:
    head = analysis.routing_headline(routed, boot=BOOT)
    row = {r["placement"]: r for r in head.iter_rows(named=True)}
    assert [r["kind"] for r in head.iter_rows(named=True)] == ["client"] * 2 + ["router"] * 2
    assert row["router:round_robin"]["known_share"] == pytest.approx(5 / 6)
    assert row["router:round_robin"]["turn_gain"] == pytest.approx(3.0, rel=0.1)
    low, high = row["router:round_robin"]["turn_gain_ci_low"], row["alternate"]["turn_gain_ci_high"]
    assert low > 1 and high > 3
    assert row["router:round_robin"]["survives"] is True
    assert row["alternate"]["survives"] is True
    # No planted gain under consistent_hash: the interval of its session gain covers 1.
    assert row["router:consistent_hash"]["survives"] is False
    assert row["router:consistent_hash"]["turn_gain"] == pytest.approx(1.0, rel=0.1)
    assert row["fixed"]["added_s"] is None  # no server TTFT in synthetic runs


def test_console_and_report_show_routing_only_when_routed(
    routed: analysis.Run, tmp_path: Path
) -> None:
    text = analysis.console_routing(routed, boot=BOOT)
    assert text is not None and "router:round_robin" in text and "100%" in text
    plain = analysis.load_run(write_run(tmp_path, SyntheticSpec(sessions=2, turns=2)))
    assert analysis.console_routing(plain) is None and routing_section(plain, BOOT) == []
    report = write_report(routed.path, boot=BOOT).read_text()
    assert "## Headline: placements, routers and the shared pool" in report
    assert "router router:round_robin: 100% of turns changed replica" in report
    assert report.index("routers and the shared pool") < report.index("shared-cache speedup")
