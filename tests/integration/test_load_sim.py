"""Load on the simulated pair: a closed-loop sweep under cache pressure, and open loop.

Small contexts and a small local KV cache keep this to seconds; what is asserted are
counts and modeled hits, never wall-clock latencies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.analysis import load_run
from sessiongen.analysis.load import load_table, reuse_distance, working_set
from sessiongen.report import write_report
from tests.support.paths import ROOT

PRESSURE = [
    "sessions.count=6",
    "sessions.turns=4",
    "sessions.initial_context_tokens=4096",
    "sessions.answer_tokens=200",
    "sessions.think_time_s=2",
    "load.levels=[1, 6]",
    "target.sim.local_cache_tokens=9000",  # about two 4.5k-token sessions per replica
    "target.sim.max_model_len=8192",
    "target.sim.time_scale=0.05",
    "design.warmup_requests=1",
]


@pytest.fixture(scope="module")
def pressure(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame]:
    sc = scenario.load(ROOT / "scenarios" / "pressure32k.toml", PRESSURE)
    out = replay.replay(
        sc, replay.ReplayOptions(runs_dir=tmp_path_factory.mktemp("runs"), progress=False)
    )
    assert out.failed == 0, out.failure_summary()
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    return out.run_dir, df


def test_one_session_at_a_time_never_needs_the_pool(pressure: tuple[Path, Any]) -> None:
    _dir, df = pressure
    alone = df.filter((pl.col("load_level") == 1) & (pl.col("turn") > 1))
    assert (alone["hit_source"] == "counters").all()  # exact attribution
    assert (alone["external_hit_tokens"] == 0).all()
    assert (alone["local_hit_tokens"] > 4000).all()  # the whole prefix, locally


def test_under_pressure_sticky_sessions_lose_their_prefix_and_the_pool_serves_it(
    pressure: tuple[Path, Any],
) -> None:
    run_dir, df = pressure
    busy = df.filter((pl.col("load_level") == 6) & (pl.col("turn") > 1))
    assert (busy["hit_source"] == "server").all()  # overlapping: the server's account
    off, on = (busy.filter(pl.col("cache") == c) for c in ("off", "on"))
    assert (off["external_hit_tokens"] == 0).all()
    # Evicted prefixes: some later turns of the OFF arm recompute most of their prompt ...
    assert (off["local_hit_tokens"] < 0.5 * off["prompt_tokens"]).any()
    # ... which with the pool on come back from the pool instead.
    assert on["external_hit_tokens"].sum() > 4 * 4096
    run = load_run(run_dir)
    ws = working_set(run).filter(pl.col("load_level") == 6)
    assert (ws["peak_replica_tokens"] > 9000).all()  # the working set exceeds the cache
    distances = reuse_distance(run).filter(
        (pl.col("load_level") == 6) & pl.col("reuse_distance_tokens").is_not_null()
    )
    assert distances["reuse_distance_tokens"].max() > 9000  # past LRU's reach


def test_the_report_opens_with_the_load_section(pressure: tuple[Path, Any]) -> None:
    run_dir, _df = pressure
    text = write_report(run_dir).read_text()
    assert text.index("## Load: does the pool pay") < text.index("## Headline")
    assert (run_dir / "report" / "saturation.png").is_file()
    table = load_table(load_run(run_dir), ttft_s=None)
    assert sorted(set(table["load_level"].to_list())) == [1.0, 6.0]


def test_open_loop_sessions_start_on_their_schedule(tmp_path: Path) -> None:
    sc = scenario.load(
        ROOT / "scenarios" / "smoke.toml",
        [
            'load.arrival="poisson"',
            "load.levels=[0.5]",
            "sessions.count=4",
            'design.blocks=["off","on"]',
            "target.sim.time_scale=0.1",
        ],
    )
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False))
    assert out.failed == 0
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    first = df.filter(pl.col("turn") == 1).sort("block", "session_index")
    by_block = first.partition_by("block", maintain_order=True)
    # Both arms replay the same seeded arrivals; the first session starts at 0.
    assert by_block[0]["arrival_s"].to_list() == by_block[1]["arrival_s"].to_list()
    assert by_block[0]["arrival_s"][0] == 0.0 and by_block[0]["arrival_s"][3] > 0
    assert (df["load_level"] == 0.5).all()


def test_four_simulated_replicas(tmp_path: Path) -> None:
    sc = scenario.load(
        ROOT / "scenarios" / "smoke.toml",
        [
            "target.sim.replicas=4",
            "sessions.count=4",
            "sessions.turns=4",
            'design.blocks=["off","on"]',
            "load.levels=[4]",
            "target.sim.time_scale=0.05",
        ],
    )
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False))
    assert out.failed == 0
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    assert sorted(df["replica"].unique().to_list()) == [0, 1, 2, 3]
    # Alternating over four replicas, every later turn is a first visit: only the pool
    # can serve its prefix.
    later_on = df.filter((pl.col("turn") > 1) & (pl.col("cache") == "on"))
    assert later_on["cross_replica"].all() and (later_on["external_hit_tokens"] > 0).all()
