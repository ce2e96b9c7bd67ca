"""Each block's cache arm checked against its counters (sessiongen.analysis.arms)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen import analysis, report
from sessiongen.analysis.arms import MISLABELED, OK, UNCHECKED
from sessiongen.client.counters import EXTERNAL_HITS
from sessiongen.records import format as fmt
from sessiongen.records import io
from tests.support.synthetic import SyntheticSpec, write_run

SPEC = SyntheticSpec(sessions=5, turns=3, contexts=(4096,))
ALT_ON = pl.col("placement") == "alternate", pl.col("cache") == "on"


def edit_requests(run_dir: Path, **columns: pl.Expr) -> None:
    df = pl.read_parquet(run_dir / "requests.parquet")
    io.atomic_write_parquet(run_dir / "requests.parquet", df.with_columns(**columns))


def edit_blocks(run_dir: Path, cache: str, **facts: Any) -> None:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    for block in manifest["blocks"]:
        if block["cache"] == cache:
            block.update(facts)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))


def external_counters(run_dir: Path, after: float) -> None:
    """Every block's external-hit counter on both replicas: 0 before, ``after`` after."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    rows = [
        fmt.CounterRecord(
            run_id=manifest["run_id"],
            block=b["block"],
            placement=b["placement"],
            cache=b["cache"],
            replica=replica,
            moment=moment,
            metric=EXTERNAL_HITS,
            value=value,
        )
        for b in manifest["blocks"]
        for replica in (0, 1)
        for moment, value in (("before", 0.0), ("after", after if b["cache"] == "on" else 0.0))
    ]
    io.atomic_write_parquet(
        run_dir / "metrics.parquet", fmt.frame_of_records(rows, fmt.CounterRecord)
    )


def statuses(run_dir: Path) -> dict[tuple[str, str], set[str]]:
    check = analysis.arm_check(analysis.load_run(run_dir))
    out: dict[tuple[str, str], set[str]] = {}
    for row in check.iter_rows(named=True):
        out.setdefault((row["placement"], row["cache"]), set()).add(row["status"])
    return out


def test_a_sane_run_passes_and_fixed_placement_cannot_check_on(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    assert statuses(run_dir) == {
        ("alternate", "off"): {OK},
        ("alternate", "on"): {OK},  # cross-replica turns served from the pool
        ("fixed", "off"): {OK},
        ("fixed", "on"): {UNCHECKED},  # no cross-replica request: nothing to show
    }
    assert analysis.mislabeled_arms(analysis.load_run(run_dir)) == []


def test_an_on_arm_without_external_hits_is_mislabeled_with_its_evidence(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    edit_requests(run_dir, external_hit_tokens=pl.lit(0, dtype=pl.Int64))
    assert statuses(run_dir)[("alternate", "on")] == {MISLABELED}
    lines = analysis.mislabeled_arms(analysis.load_run(run_dir))
    assert len(lines) == 2  # both ON blocks of alternate
    assert lines[0].startswith("block 1 (alternate, labeled cache on): ")
    # 5 sessions x 3 turns, turns 2 and 3 on the other replica (>= 512 tokens each)
    assert "17 requests with exact counts: 0 external hit tokens" in lines[0]  # + 2 warm-ups
    assert (
        "10 cross-replica requests of at least 512 prompt tokens (10 with exact counts)"
        in (lines[0])
    )


def test_an_off_arm_with_external_hits_is_mislabeled(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    off_turn2 = (pl.col("cache") == "off") & (pl.col("turn") == 2) & ~pl.col("warmup")
    edit_requests(
        run_dir,
        external_hit_tokens=pl.when(off_turn2).then(1568).otherwise(pl.col("external_hit_tokens")),
    )
    check = statuses(run_dir)
    assert check[("alternate", "off")] == check[("fixed", "off")] == {MISLABELED}
    [first, *_] = analysis.mislabeled_arms(analysis.load_run(run_dir))
    assert "labeled cache off): 15 requests with exact counts: 7,840 external hit tokens" in first


def test_without_exact_counts_the_block_counters_decide(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    edit_requests(run_dir, external_hit_tokens=pl.lit(None, dtype=pl.Int64))
    assert statuses(run_dir)[("alternate", "on")] == {UNCHECKED}  # nothing counted at all
    external_counters(run_dir, after=0.0)
    assert statuses(run_dir)[("alternate", "on")] == {MISLABELED}
    [line, _] = analysis.mislabeled_arms(analysis.load_run(run_dir))
    assert "the replicas' counters moved 0 external hit tokens over the block" in line
    external_counters(run_dir, after=3136.0)
    assert statuses(run_dir)[("alternate", "on")] == {OK}


def test_what_the_replicas_say_counts_where_the_counters_cannot_tell(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    no_connector = [{"configured": False, "source": "server_info"}] * 2
    edit_blocks(run_dir, "on", kv_connector=no_connector)
    check = statuses(run_dir)
    assert check[("alternate", "on")] == {OK}  # the pool served hits: counters win
    assert check[("fixed", "on")] == {MISLABELED}  # no cross request, and they say OFF
    edit_blocks(run_dir, "off", kv_connector=[{"configured": True}] * 2)
    assert statuses(run_dir)[("alternate", "off")] == {MISLABELED}


def test_warmups_count_only_where_the_pool_chunk_is_known(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    warm = pl.col("warmup")
    edit_requests(
        run_dir,
        external_hit_tokens=pl.lit(0, dtype=pl.Int64),
        cross_replica=pl.when(warm).then(True).otherwise(pl.col("cross_replica")),
        prompt_tokens=pl.when(warm).then(600).otherwise(pl.col("prompt_tokens")),
    )
    # fixed ON: warm-ups of 600 tokens crossed replicas without hits; the chunk is unknown
    assert statuses(run_dir)[("fixed", "on")] == {UNCHECKED}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["target"]["profile"] = {"pool_chunk_tokens": 256}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    assert statuses(run_dir)[("fixed", "on")] == {MISLABELED}


def test_the_report_leads_with_a_mislabeled_arm(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SPEC)
    clean = report.read_cautions(report.write_report(run_dir).parent)
    assert clean is not None and not any("Mislabeled" in p for p in clean["problems"])
    edit_requests(run_dir, external_hit_tokens=pl.lit(0, dtype=pl.Int64))
    cautions = report.read_cautions(report.write_report(run_dir).parent)
    assert cautions is not None
    [problem] = [p for p in cautions["problems"] if p.startswith("Mislabeled arm: ")]
    assert "2 of 8 blocks are not in the cache arm they are labeled with" in problem
    assert "block 1 (alternate, labeled cache on): 17 requests with exact counts: 0" in problem
