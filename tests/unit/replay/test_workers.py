"""replay --workers: sessions spread over processes, records as complete as in one loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sessiongen import replay, scenario
from sessiongen.errors import UserError
from sessiongen.replay.workers import split_concurrency
from tests.support.fakeserver import ThreadServer, make_app
from tests.support.paths import ROOT


def test_concurrency_is_split_evenly() -> None:
    assert split_concurrency(5, 2) == [3, 2]
    assert split_concurrency(4, 4) == [1, 1, 1, 1]
    assert sum(split_concurrency(257, 3)) == 257


def test_two_workers_against_endpoints(tmp_path: Path) -> None:
    raw: dict[str, Any] = {
        "name": "w",
        "sessions": {
            "count": 6,
            "turns": 3,
            "initial_context_tokens": 400,
            "question_tokens": 20,
            "answer_tokens": 30,
            "output_tokens": 4,
        },
        "placement": {"policies": ["alternate"]},
        "design": {"blocks": ["on"], "warmup_requests": 1},
        "driver": {"concurrency": 4},
    }
    with ThreadServer(make_app("ok", delay_s=0.02)) as a, ThreadServer(make_app("ok")) as b:
        out = replay.replay(
            scenario.from_dict(raw, "w.toml"),
            replay.ReplayOptions(
                runs_dir=tmp_path, endpoints=[a.url, b.url], cache="on", progress=False, workers=2
            ),
        )
    assert out.failed == 0 and out.requests == 6 * 3
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    assert sorted(df["session_index"].unique().to_list()) == list(range(6))
    for _sid, rows in df.group_by("session_id"):
        ordered = rows.sort("send_s")
        assert ordered["turn"].to_list() == [1, 2, 3]  # turns strictly in order per session
        assert ordered["replica"].to_list()[:2] in ([0, 1], [1, 0])
    assert (df["send_s"] > 0).all() and (df["ttft_s"] > 0).all()
    manifest = json.loads((out.run_dir / "manifest.json").read_text())
    (block,) = manifest["blocks"]
    assert block["status"] == "ok" and len(block["workers"]) == 2
    assert all("max_ms" in w for w in block["workers"])


def test_workers_on_the_simulated_pair_keep_answers_right(tmp_path: Path) -> None:
    sc = scenario.load(
        ROOT / "scenarios/smoke.toml",
        [
            "sessions.count=4",
            "driver.concurrency=4",
            'design.blocks=["off","on"]',
            "target.sim.time_scale=0.05",
        ],
    )
    out = replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False, workers=2))
    assert out.failed == 0
    df = pl.read_parquet(out.run_dir / "requests.parquet").filter(~pl.col("warmup"))
    assert df.height == 2 * 4 * 3
    assert df["answer_correct"].all()
    # Overlapping requests: counters around each are not its own, so the hits come from
    # the simulator's per-request account.
    assert (df["hit_source"] == "server").all()
    assert df["local_hit_tokens"].null_count() == 0


def test_workers_need_enough_concurrency(tmp_path: Path) -> None:
    sc = scenario.load(ROOT / "scenarios/smoke.toml", ["driver.concurrency=1"])
    with pytest.raises(UserError, match=r"driver\.concurrency >= 2"):
        replay.replay(sc, replay.ReplayOptions(runs_dir=tmp_path, progress=False, workers=2))
