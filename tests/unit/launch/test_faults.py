"""The fault a user can plant in the managed pair: its field, its command line, its chunks.

The wrapper itself runs inside vLLM (tests/realstack/test_fault.py); here is everything
around it that needs no serving stack: validation at load, what ``--kv-transfer-config``
carries, the seeded choice of hit chunks, the fault log, and the labels a fault run gets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sessiongen import scenario
from sessiongen.cli import cli
from sessiongen.errors import ScenarioError
from sessiongen.launch import commands, faults
from sessiongen.launch.pair import ManagedPair
from sessiongen.records.meta import RunMeta
from sessiongen.scenario.spec import ManagedFault, ManagedSpec
from sessiongen.targets.managed import ManagedTarget
from sessiongen.trend.store import versions_of
from tests.support.paths import ROOT

SMOKE_CPU = ROOT / "scenarios/smoke-cpu.toml"
COMMON = dict(model_arg="/m", dummy_weights=False, served_name="tiny", host="127.0.0.1")


def fault_spec(kind: str = "stale", share: float = 1.0, seed: int = 0) -> ManagedSpec:
    return ManagedSpec(fault=ManagedFault(kind=kind, share=share, seed=seed))  # type: ignore[arg-type]


# ----------------------------------------------------------------- the scenario field


def test_fault_field_loads_and_defaults_to_the_healthy_stack() -> None:
    healthy = scenario.load(SMOKE_CPU)
    assert healthy.target.managed.fault == ManagedFault() and not ManagedFault().planted
    sc = scenario.load(
        SMOKE_CPU, ["target.managed.fault.kind=noise", "target.managed.fault.share=0.05"]
    )
    assert sc.target.managed.fault == ManagedFault(kind="noise", share=0.05, seed=0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("kind=bogus", 'target.managed.fault.kind: expected one of "none", "stale", "noise"'),
        ("share=0", "target.managed.fault.share: expected a number > 0 and <= 1, got 0"),
        ("share=1.5", "target.managed.fault.share: expected a number > 0 and <= 1, got 1.5"),
        ("seed=-1", "target.managed.fault.seed: expected an integer >= 0, got -1"),
        ("typo=1", "target.managed.fault.typo: unknown key"),
    ],
)
def test_bad_fault_values_name_file_and_field(override: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario.load(SMOKE_CPU, [f"target.managed.fault.{override}"])
    assert str(err.value).startswith(f"{SMOKE_CPU}: {message}")


def test_a_fault_on_a_target_that_is_not_managed_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"target\.managed\.fault\.kind: a fault is planted"):
        scenario.load(ROOT / "scenarios/smoke.toml", ["target.managed.fault.kind=stale"])


def test_bad_fault_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    args = ["replay", str(SMOKE_CPU), "--runs-dir", str(tmp_path), "--no-progress"]
    result = CliRunner().invoke(cli, [*args, "--set", "target.managed.fault.share=2"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [
        f"sessiongen: error: {SMOKE_CPU}: target.managed.fault.share: expected a number "
        "> 0 and <= 1, got 2"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


# ----------------------------------------------------------------- the command line


def test_healthy_connector_config_is_unchanged() -> None:
    assert commands.kv_transfer_config("127.0.0.1", 6555) == (
        '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both","kv_connector_extra_config":'
        '{"lmcache.mp.host":"tcp://127.0.0.1","lmcache.mp.port":6555}}'
    )
    assert commands.kv_transfer_config("127.0.0.1", 6555, ManagedFault()) == (
        commands.kv_transfer_config("127.0.0.1", 6555)
    )


def test_fault_loads_the_wrapper_in_cache_on_replicas_only(tmp_path: Path) -> None:
    spec = fault_spec("noise", 0.2, 3)
    log = tmp_path / "fault-replica-0.jsonl"
    on = commands.vllm_argv("py", spec, port=8011, lmcache_port=6555, fault_log=log, **COMMON)
    off = commands.vllm_argv("py", spec, port=8011, lmcache_port=None, fault_log=log, **COMMON)
    config = json.loads(on[on.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == faults.CONNECTOR_CLASS == "FaultyLMCacheMPConnector"
    assert config["kv_connector_module_path"] == "sessiongen.launch.faultconnector"
    extra = config["kv_connector_extra_config"]
    assert extra["lmcache.mp.port"] == 6555 and config["kv_role"] == "kv_both"
    assert extra[faults.EXTRA_KEY] == {"kind": "noise", "share": 0.2, "seed": 3, "log": str(log)}
    assert faults.FaultConfig.from_extra(extra) == faults.FaultConfig("noise", 0.2, 3, str(log))
    healthy_off = commands.vllm_argv("py", ManagedSpec(), port=8011, lmcache_port=None, **COMMON)
    assert off == healthy_off  # the OFF arm has no connector to plant a fault in


def test_pair_gives_each_cache_on_replica_its_own_fault_log(tmp_path: Path) -> None:
    faulty = ManagedPair(fault_spec(), "tiny", True, tmp_path)
    assert [faulty.fault_log(i) for i in range(2)] == [
        tmp_path / "fault-replica-0.jsonl",
        tmp_path / "fault-replica-1.jsonl",
    ]
    assert ManagedPair(fault_spec(), "tiny", False, tmp_path).fault_log(0) is None
    assert ManagedPair(ManagedSpec(), "tiny", True, tmp_path).fault_log(0) is None


@pytest.mark.parametrize(
    "entry",
    [
        None,
        {"kind": "none", "share": 1.0, "seed": 0},
        {"kind": "stale", "share": 0, "seed": 0},
        {"kind": "stale", "share": True, "seed": 0},
        {"kind": "stale", "share": 0.5, "seed": -2},
        {"kind": "stale", "share": 0.5, "seed": 0, "log": 7},
    ],
)
def test_wrapper_refuses_a_malformed_fault(entry: object) -> None:
    with pytest.raises(ValueError, match=r"sessiongen\.fault"):
        faults.FaultConfig.from_extra({faults.EXTRA_KEY: entry} if entry else {})


def test_fault_wrapper_stays_out_of_sessiongens_own_imports() -> None:
    """torch, vLLM and the wrapper are loaded only inside the vLLM process."""
    code = (
        "import sys, sessiongen.cli, sessiongen.targets.managed, sessiongen.launch.pair, "
        "sessiongen.launch.faults\n"
        "print(sorted(m for m in ('torch', 'vllm', 'lmcache', "
        "'sessiongen.launch.faultconnector') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------- which chunks are hit


def tokens(n: int, salt: int = 0) -> list[int]:
    return [(i * 7919 + salt * 104729) % 100_000 for i in range(n)]


def test_share_one_hits_every_chunk_and_draws_are_seeded() -> None:
    ids = tokens(8192 + 100)
    assert faults.hit_chunks(ids, 0, 8192, 256, share=1.0, seed=0) == list(range(32))
    draws = faults.chunk_draws(ids, 0, 8192, 256, seed=0)
    assert draws == faults.chunk_draws(ids, 0, 8192, 256, seed=0)
    assert draws != faults.chunk_draws(ids, 0, 8192, 256, seed=1)
    assert all(0 <= u < 1 for u in draws) and len(set(draws)) == 32


def test_a_chunks_draw_is_its_place_in_the_prompt_not_the_load() -> None:
    """The same chunk drawn in a load from 0 and in a load that starts after vLLM's own
    prefix cache gets one draw; a change in any earlier token gives another."""
    ids = tokens(4096)
    whole = faults.chunk_draws(ids, 0, 4096, 256, seed=5)
    assert faults.chunk_draws(ids, 1024, 4096, 256, seed=5) == whole[4:]
    longer = [*ids, *tokens(512, salt=1)]  # the next turn: same prefix, more chunks
    assert faults.chunk_draws(longer, 0, 4608, 256, seed=5)[:16] == whole
    changed = [*ids[:100], ids[100] + 1, *ids[101:]]
    redrawn = faults.chunk_draws(changed, 0, 4096, 256, seed=5)
    assert all(a != b for a, b in zip(redrawn, whole, strict=True))


def test_hit_share_follows_share_over_many_chunks() -> None:
    ids = tokens(256 * 2000)
    for share in (0.01, 0.05, 0.2):
        hit = len(faults.hit_chunks(ids, 0, len(ids), 256, share=share, seed=0))
        mean, sd = 2000 * share, (2000 * share * (1 - share)) ** 0.5
        assert abs(hit - mean) < 4 * sd, (share, hit)


def test_bad_chunk_range_is_refused() -> None:
    with pytest.raises(ValueError, match="bad chunk range"):
        faults.chunk_draws([1, 2], 256, 0, 256, seed=0)


# ----------------------------------------------------------------- the fault log


def test_fault_log_is_tallied_from_an_offset_and_skips_a_partial_line(tmp_path: Path) -> None:
    log = tmp_path / "fault-replica-0.jsonl"
    assert faults.read_log(log) == (faults.FaultTally(), 0)
    log.write_text(
        faults.log_record("a", 0, 8192, 32, [0, 5]) + faults.log_record("b", 256, 512, 1, [])
    )
    first, offset = faults.read_log(log)
    assert first == faults.FaultTally(loads=2, loads_hit=1, chunks=33, chunks_hit=2)
    with log.open("a") as fh:
        fh.write(faults.log_record("c", 0, 256, 1, [0]) + '{"request": "d", "sta')
    later, offset2 = faults.read_log(log, offset)
    assert later == faults.FaultTally(loads=1, loads_hit=1, chunks=1, chunks_hit=1)
    assert offset2 < log.stat().st_size  # the partial line is read next time
    assert (first + later).to_dict() == {"loads": 3, "loads_hit": 2, "chunks": 34, "chunks_hit": 3}


# ----------------------------------------------------------------- the run's labels


def managed_manifest(fault: ManagedFault, blocks: list[dict[str, object]]) -> dict[str, object]:
    sets = [f"target.managed.fault.{k}={getattr(fault, k)}" for k in ("kind", "share", "seed")]
    target = ManagedTarget(scenario.load(SMOKE_CPU, sets))
    return {"run_id": "r", "target": target.describe(), "blocks": blocks}


def test_fault_is_in_the_manifest_labels_and_trend_versions() -> None:
    fault = ManagedFault(kind="stale", share=0.05, seed=2)
    hits = {"loads": 4, "loads_hit": 3, "chunks": 128, "chunks_hit": 7}
    manifest = managed_manifest(fault, [{"cache": "off"}, {"cache": "on", "fault": hits}])
    assert manifest["target"]["fault"]["kind"] == "stale"  # type: ignore[index]
    meta = RunMeta.from_manifest(manifest)
    assert meta.planted_fault == (
        "stale, 5% of the KV chunks loaded from the shared pool left as their blocks were "
        "before the copy (read before it finished)"
    )
    assert meta.fault_hits == hits
    line = meta.fault_line()
    assert line is not None and line.startswith("PLANTED FAULT: stale, 5% of the KV chunks")
    assert "it hit 7 of the 128 chunks in 3 of the 4 loads from the pool" in line
    assert "not a measurement of the healthy stack" in line
    assert versions_of(meta)["planted_fault"] == meta.planted_fault


def test_healthy_runs_carry_no_fault_label() -> None:
    meta = RunMeta.from_manifest(managed_manifest(ManagedFault(), [{"cache": "on"}]))
    assert "fault" not in meta.target
    assert (meta.planted_fault, meta.fault_hits, meta.fault_line()) == (None, None, None)
    assert "planted_fault" not in versions_of(meta)


def test_the_simulators_planted_fault_is_labelled_alike() -> None:
    sim = {"target": {"kind": "sim", "simulated": True, "profile": {"pool_corruption": 1.0}}}
    meta = RunMeta.from_manifest(sim)
    assert meta.planted_fault == "pool_corruption, 100% of the answers the pool serves corrupted"
    clean = {"target": {"kind": "sim", "simulated": True, "profile": {"pool_corruption": 0.0}}}
    assert RunMeta.from_manifest(clean).planted_fault is None
