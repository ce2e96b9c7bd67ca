"""A real cache fault, caught on the real stack: the equivalence probe against a planted fault.

``target.managed.fault`` loads sessiongen's wrapper of LMCache's connector into the
cache-ON vLLM replicas (sessiongen/launch/faultconnector.py); with ``stale`` at share 1
every KV chunk they load from the shared pool keeps what its blocks held before the copy,
as if read before the copy finished (the transfer bug the study behind sessiongen found).
``sessiongen replay scenarios/smoke-cpu.toml`` must then exit 1 with a cache failure, and
its report must name the pool-served requests that diverged. The same scenario without
the fault is clean: tests/realstack/test_replay.py (its run passes the equivalence probe,
unlabelled).

The run is ON then OFF (``design.blocks``), not the scenario's OFF, ON, ON, OFF: the
second ON block would send the same prompts and be hit in the same chunks (the choice is
a hash of the chunk's tokens), so it adds nothing here but a reset, and the last OFF
block a third pair. One pair start of its own: the faulty ON pair, whose command line
differs, started while no shared pair runs; then the OFF block leases the session's
shared OFF pair, cold (tests/realstack/conftest.py), which the tier's OFF phase goes on
using: hence ON first, and this test among the tier's first (``own_pairs``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner, Result

from sessiongen import analysis
from sessiongen.analysis.correctness import AGREES, CACHE_FAILURE, DIVERGED
from sessiongen.cli import cli
from tests.realstack.conftest import StartupClock
from tests.support.paths import ROOT

pytestmark = [
    pytest.mark.realstack,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="the real stack is not installed (scripts/install-real-stack.sh)",
    ),
    # Two pair starts (the faulty ON pair, then the shared OFF pair when it is the first
    # to lease it); ~20 requests take less than half a start-up.
    pytest.mark.pair_starts(2, work=0.5),
    pytest.mark.own_pairs(shared=True),
]

SMOKE_CPU = ROOT / "scenarios/smoke-cpu.toml"
FAULT = [
    "target.managed.fault.kind=stale",
    "target.managed.fault.share=1.0",
    'design.blocks=["on","off"]',
    # A cache failure is a pool-served divergence rate above the noise baseline (exact
    # test): with 2 sessions, 2 of 2 pool-served against 0 of 2 is p = 0.06; with 4 the
    # pool serves at least 4 against at least 4 cold ones (p <= 0.004). Requests cost
    # little beside a pair start.
    "sessions.count=4",
]


@pytest.fixture(scope="module")
def fault_run(
    tmp_path_factory: pytest.TempPathFactory, startup: StartupClock
) -> tuple[Result, Path, dict[str, Any]]:
    """``sessiongen replay smoke-cpu.toml`` with the fault planted, report written."""
    runs = tmp_path_factory.mktemp("fault-runs")
    args = ["replay", str(SMOKE_CPU), "--runs-dir", str(runs), "--no-progress"]
    for item in [*startup.overrides(), *FAULT]:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args)
    run_dirs = [p for p in runs.iterdir() if (p / "manifest.json").exists()]
    assert len(run_dirs) == 1, result.output
    manifest = json.loads((run_dirs[0] / "manifest.json").read_text())
    return result, run_dirs[0], manifest


def test_planted_fault_exits_1_with_a_cache_failure(
    fault_run: tuple[Result, Path, dict[str, Any]],
) -> None:
    result, run_dir, manifest = fault_run
    assert manifest["complete"] is True and all(b["status"] == "ok" for b in manifest["blocks"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("sessiongen: error")]
    assert len(errors) == 1 and errors[0].startswith("sessiongen: error: cache failures: ")
    assert "pool-served answers differ from OFF, against" in errors[0]
    assert "PLANTED FAULT: stale, 100% of the KV chunks loaded from the shared pool" in (
        result.output
    )
    assert "correctness: equivalence cache failure" in result.output
    eq = analysis.correctness(analysis.load_run(run_dir)).equivalence
    assert eq.verdict == CACHE_FAILURE and eq.off_inconsistent == 0
    assert eq.failures >= 2 and eq.ids_differ == eq.failures


def test_the_pool_served_requests_diverged_and_only_they(
    fault_run: tuple[Result, Path, dict[str, Any]],
) -> None:
    """The fault is in what the pool serves: every ON answer it served is wrong, every
    other ON answer (cold first turns, local prefix-cache hits) agrees with OFF."""
    _result, run_dir, _manifest = fault_run
    judged = analysis.divergences(analysis.load_run(run_dir))
    served = judged.filter(pl.col("pool_served"))
    assert served.height >= 4  # turn 2 of each session crossed replicas through the pool
    assert (served["verdict"] == DIVERGED).all(), served
    assert (judged.filter(~pl.col("pool_served"))["verdict"] == AGREES).all(), judged


def test_report_labels_the_run_and_names_the_diverged_requests(
    fault_run: tuple[Result, Path, dict[str, Any]],
) -> None:
    _result, run_dir, _manifest = fault_run
    text = (run_dir / "report" / "report.md").read_text()
    header = text.split("## ")[0]
    assert "PLANTED FAULT: stale, 100% of the KV chunks" in header
    assert "not a measurement of the healthy stack" in header
    assert "Correctness (cache failure)" in text
    table = text.split("All ON answers that differ from OFF's:")[1].split("\n\n")[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    named = {(row[1], int(row[2])) for row in rows if row[4] == "yes"}  # pool_served
    judged = analysis.divergences(analysis.load_run(run_dir))
    diverged = judged.filter(pl.col("pool_served") & (pl.col("verdict") == DIVERGED))
    assert named == set(zip(diverged["session_id"], diverged["turn"], strict=True))


def test_manifest_records_the_fault_and_what_it_hit(
    fault_run: tuple[Result, Path, dict[str, Any]],
) -> None:
    _result, _run_dir, manifest = fault_run
    fault = manifest["target"]["fault"]
    assert (fault["kind"], fault["share"], fault["seed"]) == ("stale", 1.0, 0)
    assert manifest["target"]["spec"]["fault"] == {"kind": "stale", "share": 1.0, "seed": 0}
    on, off = manifest["blocks"]
    assert (on["cache"], off["cache"]) == ("on", "off")
    assert "fault" not in off
    hits = on["fault"]
    assert hits["chunks_hit"] == hits["chunks"] >= 2 * 32  # turn 2: 32 chunks of 256 tokens
    assert hits["loads_hit"] == hits["loads"] >= 2
    on_argv, off_argv = (
        [" ".join(p["argv"]) for p in block["processes"] if p["role"] == "replica"]
        for block in manifest["target"]["blocks"]
    )
    assert all("--kv-transfer-config" not in argv for argv in off_argv)
    assert all('"kv_connector":"FaultyLMCacheMPConnector"' in argv for argv in on_argv)
    assert all("sessiongen.launch.faultconnector" in argv for argv in on_argv)
