"""A shipped trace replayed on the embedded simulated pair: OFF and ON, client placements,
a router; hits where the trace says prompts share a prefix, its facts in the records.

Every assertion is on counted values (hit tokens, replicas, line numbers), never on
timings. The trace runs 4x faster than written and the simulator at 0.02 wall seconds a
modeled second: the assertions do not depend on when requests overlap, only on which
turn of a session follows which (closed loop within a session).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.errors import UserError
from sessiongen.report import write_report
from tests.support.paths import ROOT

CHAT = ROOT / "scenarios/traces/chat-replay.toml"
FAST = ["target.sim.time_scale=0.02", "sessions.trace.speedup=4"]
#: The simulated pool's chunk (default profile): the pool serves whole chunks only.
POOL_CHUNK = 1568

Ran = tuple[pl.DataFrame, dict[str, Any], Path]


def run(runs: Path, *overrides: str) -> Ran:
    sc = scenario.load(CHAT, [*FAST, *overrides])
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=runs, progress=False))
    assert out.failed == 0, out.failure_summary()
    df = pl.read_parquet(out.run_dir / "requests.parquet")
    return df, json.loads((out.run_dir / "manifest.json").read_text()), out.run_dir


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run(tmp_path_factory.mktemp("runs"), 'design.blocks=["off","on"]')


def measured(df: pl.DataFrame) -> pl.DataFrame:
    return df.filter(~pl.col("warmup"))


def test_every_line_is_replayed_once_per_block_with_its_facts(chat: Ran) -> None:
    df, manifest, _ = chat
    assert [(b["placement"], b["cache"]) for b in manifest["blocks"]] == [
        ("alternate", "off"),
        ("alternate", "on"),
        ("fixed", "off"),
        ("fixed", "on"),
    ]
    lines = [orjson.loads(x) for x in (CHAT.parent / "chat-sessions.jsonl").read_bytes().split()]
    m = measured(df)
    for block in range(4):
        rows = m.filter(pl.col("block") == block).sort("trace_line")
        assert rows["trace_line"].to_list() == list(range(1, 19))
        assert rows["session_id"].to_list() == [r["session_id"] for r in lines]
        assert rows["prompt_tokens"].min() >= min(r["input_length"] for r in lines)
        assert rows["completion_tokens"].to_list() == [r["output_length"] for r in lines]
        # turn k+1 of a session extends turn k by the trace's new blocks
        later = rows.filter(pl.col("turn") > 1)
        assert (later["trace_shared_blocks"] >= 5).all()
        assert (later["trace_shared_tokens"] == 512 * later["trace_shared_blocks"]).all()
        assert rows.filter(pl.col("trace_line") == 1)["trace_reuse_distance"].to_list() == [None]
    warm = df.filter(pl.col("warmup"))
    assert warm["trace_line"].null_count() == warm.height


def test_shared_prefixes_hit_and_only_the_pool_serves_cross_replica_turns(chat: Ran) -> None:
    m = measured(chat[0])
    later = m.filter(pl.col("turn") > 1)  # the trace says each shares >= 5 blocks
    on = later.filter(pl.col("cache") == "on")
    assert ((on["local_hit_tokens"] + on["external_hit_tokens"]) > 0).all()
    assert (m.filter(pl.col("cache") == "off")["external_hit_tokens"] == 0).all()
    # Turn 2 under alternate: the first visit to the other replica, a 2,560-token or longer
    # shared prefix: the pool serves at least one whole chunk, only when it is on.
    moved = later.filter((pl.col("placement") == "alternate") & (pl.col("turn") == 2))
    assert moved["cross_replica"].all()
    moved_on = moved.filter(pl.col("cache") == "on")
    assert (moved_on["external_hit_tokens"] > 0).all()
    assert (moved_on["local_hit_tokens"] + moved_on["external_hit_tokens"] >= POOL_CHUNK).all()
    # Fixed keeps a session on its replica: its own earlier turn is found locally.
    fixed = later.filter(pl.col("placement") == "fixed")
    assert not fixed["cross_replica"].any()
    assert (fixed["local_hit_tokens"] >= 512 * 5).all()


def test_the_report_renders_for_a_trace_run(chat: Ran) -> None:
    text = write_report(chat[2]).read_text()
    # First turns hit the shared system prompt the trace says they share: not contamination.
    assert "Contamination:" in text and "hit a cache where none should" not in text
    assert "not exercised on a trace" in text
    # Only line 1 shares nothing: one cold unit, whose point interval is not a finding.
    assert "Arms differ beyond the cache" not in text
    # Sessions are complete by their own lengths (3 turns), not the scenario's default 6.
    whole = text[text.index("## Whole sessions") :].split("\n\n")[1].splitlines()
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in whole[2:]}
    assert {k: [c.strip() for c in v] for k, v in rows.items()} == {
        "alternate": ["6", "6"],
        "fixed": ["6", "6"],
    }


def test_fixed_by_prefix_root_keeps_a_prefix_on_one_replica(tmp_path: Path) -> None:
    df, _, _ = run(
        tmp_path,
        "sessions.trace.file=single-requests.jsonl",
        "sessions.trace.placement_key=prefix",
        'placement.policies=["fixed"]',
        'design.cache=["on"]',
        'design.blocks=["on"]',
    )
    m = measured(df)
    assert m.height == 12 and (m["turn"] == 1).all()
    assert m["session_id"].n_unique() == 12
    assert set(m["replica"].to_list()) == {0}  # every line starts with block 0


@pytest.mark.skipif(
    importlib.util.find_spec("vllm_router") is None,
    reason="vllm-router is not installed (scripts/install-router.sh; make test installs it)",
)
def test_a_trace_through_the_router_keeps_sessions_by_their_trace_ids(tmp_path: Path) -> None:
    df, manifest, _ = run(
        tmp_path,
        'placement.policies=["router:consistent_hash"]',
        'design.cache=["on"]',
        'design.blocks=["on"]',
    )
    assert manifest["blocks"][0]["status"] == "ok"
    m = measured(df)
    assert m.height == 18 and m["replica"].null_count() == 0
    # consistent_hash keys on the session header: each trace session stays on one replica
    per = m.group_by("session_id").agg(pl.col("replica").n_unique().alias("n"))
    assert (per["n"] == 1).all()
    later = m.filter(pl.col("turn") > 1)
    assert (later["local_hit_tokens"] >= 512 * 5).all()


@pytest.mark.timeout(300)  # ~25 s here; the old failure was a hang, not an error
def test_a_trace_runs_in_worker_processes(tmp_path: Path) -> None:
    # An open loop's cap (load.max_in_flight) once became each worker's connection count,
    # and the workers hung opening them; streams are now capped by the sessions.
    sc = scenario.load(
        CHAT,
        [
            *FAST,
            "driver.concurrency=4",
            'placement.policies=["alternate"]',
            'design.blocks=["on"]',
        ],
    )
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False, workers=2))
    assert out.failed == 0, out.failure_summary()
    m = measured(pl.read_parquet(out.run_dir / "requests.parquet"))
    assert sorted(m["trace_line"].to_list()) == list(range(1, 19))
    assert (m.filter(pl.col("turn") == 2)["external_hit_tokens"] > 0).all()


def infinite_share_of(path: Path, block_tokens: int = 512) -> tuple[int, int]:
    """(shared tokens, prompt tokens) of a trace file, computed here from its lines: a
    line's leading hash ids seen in an earlier line, in tokens (at most its length)."""
    seen: set[int] = set()
    shared = prompt = 0
    for raw in path.read_bytes().split():
        line = orjson.loads(raw)
        ids = line["hash_ids"]
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        shared += min(k * block_tokens, line["input_length"])
        prompt += line["input_length"]
        seen.update(ids)
    return shared, prompt


def arm_rows(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The reuse section's per-arm table as {(placement, cache): {column: cell}}."""
    section = text[text.index("## Reuse: ") :]
    table = [ln for ln in section.split("\n\n")[2].splitlines() if ln.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            for ln in table[2:]]  # fmt: skip
    return {(r["placement"], r["cache"]): r for r in rows}


def test_the_report_says_what_reuse_the_trace_allows_and_what_the_pool_recovered(
    chat: Ran,
) -> None:
    report = write_report(chat[2])
    text = report.read_text()
    shared, prompt = infinite_share_of(CHAT.parent / "chat-sessions.jsonl")
    assert f"could have served {shared} of them (infinite-cache share {shared / prompt:.1%})" in (
        text
    )
    arms = arm_rows(text)
    assert set(arms) == {(p, c) for p in ("alternate", "fixed") for c in ("off", "on")}
    for row in arms.values():
        assert float(row["infinite_share"]) == pytest.approx(shared / prompt, abs=5e-4)
        assert int(row["prompt_tokens"]) == prompt
        assert float(row["replica_share"]) <= float(row["infinite_share"])
    # alternate sends every later turn to the other replica: less is local than under fixed
    assert float(arms["alternate", "on"]["replica_share"]) < float(
        arms["fixed", "on"]["replica_share"]
    )
    assert float(arms["alternate", "off"]["pool_share"]) == 0.0
    assert float(arms["alternate", "on"]["pool_share"]) > 0.0
    recovered = int(arms["alternate", "on"]["recovered_tokens"])
    beyond = int(arms["alternate", "on"]["beyond_local_tokens"])
    assert 0 < recovered <= beyond
    said = next(p for p in text.split("\n\n") if p.startswith("alternate: unbounded local"))
    assert f"The pool recovered {recovered} of the {beyond} tokens" in said
    # the pool is read against the bound the local hits as run leave, never above it
    for row in arms.values():
        assert float(row["pool_within_share"]) <= float(row["beyond_local_share"]) + 5e-4
    assert "within that bound" in said and "with reuse beyond the local hits" in said
    assert "### Reuse distance" in text and "### Working set against capacity" in text
    assert (report.parent / "reuse.png").is_file()


@pytest.mark.parametrize(
    ("file", "why"),
    [
        (str(CHAT.parent / "single-requests.jsonl"), "no longer matches the records"),
        ("gone.jsonl", "traces/gone.jsonl: no such file)"),
    ],
)
def test_a_trace_that_changed_or_went_since_the_run_is_not_read_as_its_own(
    chat: Ran, tmp_path: Path, file: str, why: str
) -> None:
    run_dir = tmp_path / "changed"
    shutil.copytree(chat[2], run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["sessions"]["trace"]["file"] = file
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    text = write_report(run_dir).read_text()
    assert "Replica share and working set: not enough data:" in text
    assert why in text
    assert "### Working set against capacity" not in text
    # what the records say of the trace is still reported
    shared, prompt = infinite_share_of(CHAT.parent / "chat-sessions.jsonl")
    assert f"infinite-cache share {shared / prompt:.1%}" in text


def test_one_session_at_a_time_reads_each_requests_hits_from_the_counters(
    tmp_path: Path,
) -> None:
    """``load.max_in_flight = 1``: a trace's requests never overlap, so each one's hits
    are the replica's counter deltas around it (exact), as in a closed loop at level 1;
    the real CPU pair has no other per-request account of its pool hits."""
    df, _, _ = run(
        tmp_path,
        "load.max_in_flight=1",
        'placement.policies=["alternate"]',
        'design.blocks=["off","on"]',
    )
    m = measured(df)
    assert m.height == 2 * 18
    assert m["hit_source"].to_list() == ["counters"] * m.height
    assert (m.filter(pl.col("cache") == "off")["external_hit_tokens"] == 0).all()
    moved_on = m.filter((pl.col("cache") == "on") & (pl.col("turn") == 2))
    assert moved_on["cross_replica"].all()
    assert (moved_on["external_hit_tokens"] > 0).all()


def test_workers_need_a_session_in_flight_each(tmp_path: Path) -> None:
    """Two workers under ``max_in_flight = 1`` would each run a session, overlapping
    requests the counters then count as exact: refused before anything starts."""
    sc = scenario.load(CHAT, [*FAST, "driver.concurrency=4", "load.max_in_flight=1"])
    with pytest.raises(UserError, match=r"expected load\.max_in_flight >= 2"):
        replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False, workers=2))
    assert list(tmp_path.iterdir()) == []
