"""Load analysis on hand-made runs with known truth: goodput, sustained load, reuse, working set."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sessiongen.analysis import hypotheses, load
from sessiongen.analysis.frames import rows_frame
from sessiongen.records.format import REQUEST_SCHEMA
from sessiongen.records.meta import RunMeta
from sessiongen.records.run import Run


def make_run(rows: list[dict[str, Any]]) -> Run:
    base = {"status": "ok", "warmup": False, "context_tokens": 1000, "turn": 1}
    frame = rows_frame([{**base, **r} for r in rows], REQUEST_SCHEMA)
    return Run(Path("x"), RunMeta.from_manifest({"run_id": "x"}), frame)


def level_rows(level: float, cache: str, ttfts: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "placement": "fixed",
            "cache": cache,
            "load_level": level,
            "block": int(level * 10) + (cache == "on"),
            "session_id": f"s{i}",
            "ttft_s": t,
            "send_s": float(i),
            "e2e_s": t + 0.5,
            "queue_s": 0.0,
        }
        for i, t in enumerate(ttfts)
    ]


def test_wilson_interval() -> None:
    low, high = hypotheses.wilson(9, 10)
    assert 0.59 < low < 0.6 and 0.98 < high < 0.99  # 0.596, 0.982 (Wilson 1927)
    assert all(math.isnan(v) for v in hypotheses.wilson(0, 0))


@pytest.mark.parametrize("sessions", [8, 20])
def test_goodput_interval_covers_with_sessions_as_units(sessions: int) -> None:
    # Each session has its own good probability (Beta, mean 0.8, concentration 2: its
    # turns are mostly all good or all bad). A Wilson interval over turns covered about
    # 58% of the truth; sessions as units must cover near 95%.
    rng = np.random.default_rng(sessions)
    covered = naive = 0
    reps = 1000
    for _ in range(reps):
        good = rng.binomial(6, rng.beta(1.6, 0.4, size=sessions))
        share = hypotheses.clustered_share(good, np.full(sessions, 6))
        covered += share.low <= 0.8 <= share.high
        low, high = hypotheses.wilson(int(good.sum()), 6 * sessions)
        naive += low <= 0.8 <= high
    assert 0.93 <= covered / reps <= 0.97, covered
    assert naive / reps < 0.9  # what the interval over turns gave


def test_goodput_table_names_its_unit() -> None:
    # Two sessions of 20 turns each, one all good, one all bad: 2 units, not 40.
    rows = level_rows(1.0, "off", [1.0] * 20 + [5.0] * 20)
    rows = [{**r, "session_id": f"s{i // 20}"} for i, r in enumerate(rows)]
    table = load.load_table(make_run(rows), ttft_s=2.0, attainment=0.9)
    row = table.row(0, named=True)
    assert row["good_units"] == 2 and row["good_turns"] == 0.5
    assert row["good_turns_high"] - row["good_turns_low"] > 0.9  # two sessions say little
    naive = hypotheses.wilson(20, 40)
    assert naive[1] - naive[0] < 0.35


def test_goodput_and_sustained_load() -> None:
    rows = []
    for level, off_slow, on_slow in ((1.0, 0, 0), (2.0, 12, 1), (4.0, 40, 30)):
        rows += level_rows(level, "off", [5.0] * off_slow + [1.0] * (40 - off_slow))
        rows += level_rows(level, "on", [5.0] * on_slow + [1.0] * (40 - on_slow))
    table = load.load_table(make_run(rows), ttft_s=2.0, attainment=0.9)
    got = {(r["cache"], r["load_level"]): r for r in table.iter_rows(named=True)}
    assert got[("off", 2.0)]["good_turns"] == pytest.approx(28 / 40)
    assert got[("on", 2.0)]["good_turns"] == pytest.approx(39 / 40)
    assert got[("off", 1.0)]["good_sessions"] == 1.0 and got[("off", 2.0)]["good_sessions"] == 0.7
    assert [got[("on", lv)]["meets"] for lv in (1.0, 2.0, 4.0)] == [True, True, False]
    sustained = {r["cache"]: r for r in load.sustained_load(table).iter_rows(named=True)}
    assert sustained["off"]["sustains"] == 1.0 and sustained["on"]["sustains"] == 2.0
    assert sustained["off"]["fails"] == 2.0 and sustained["on"]["fails"] == 4.0
    assert sustained["on"]["sure"] == 1.0  # 39/40 has a Wilson low bound under 0.9
    assert sustained["on"]["monotone"] and sustained["off"]["monotone"]


def _goodput_rows(level: float, good: int) -> list[dict[str, Any]]:
    return level_rows(level, "on", [1.0] * good + [5.0] * (100 - good))


def test_sustained_load_is_monotone_and_flags_sweeps_that_are_not() -> None:
    # 95%, 80%, 93% good at 1, 2, 4: the max of passing (4), max of sure and min of
    # fails (2) said "sustains 4, fails from 2", a contradiction printed as a finding.
    rows = _goodput_rows(1.0, 95) + _goodput_rows(2.0, 80) + _goodput_rows(4.0, 93)
    table = load.load_table(make_run(rows), ttft_s=2.0, attainment=0.9)
    got = load.sustained_load(table).row(0, named=True)
    assert got["sustains"] == 1.0
    assert got["fails"] is None  # level 4 does not surely fail: nothing fails from 2 on
    assert got["monotone"] is False
    assert got["sure"] is None or got["sure"] <= got["sustains"]
    clean = _goodput_rows(1.0, 99) + _goodput_rows(2.0, 98) + _goodput_rows(4.0, 40)
    table = load.load_table(make_run(clean), ttft_s=2.0, attainment=0.9)
    got = load.sustained_load(table).row(0, named=True)
    assert (got["sustains"], got["fails"], got["monotone"]) == (2.0, 4.0, True)


def test_p90_needs_enough_samples() -> None:
    few = load.load_table(make_run(level_rows(1.0, "off", [1.0] * 20)), ttft_s=None)
    assert few["p90_ttft_s"][0] is None and "of 64 needed" in few["p90_note"][0]
    # 8 sessions of 10 turns each, each session's turns alike: 8 samples, not 80.
    rows = [
        {**r, "session_id": f"s{i // 10}", "ttft_s": 1.0 + i // 10}
        for i, r in enumerate(level_rows(1.0, "off", [1.0] * 80))
    ]
    clustered = load.load_table(make_run(rows), ttft_s=None)
    assert clustered["p90_ttft_s"][0] is None
    assert "8 effective of 64 needed" in clustered["p90_note"][0]
    many = load.load_table(make_run(level_rows(1.0, "off", [1.0] * 70)), ttft_s=None)
    assert many["p90_ttft_s"][0] == 1.0 and many["good_turns"][0] is None


def test_reuse_distance_counts_tokens_the_replica_served_in_between() -> None:
    def req(session: str, replica: int, t: float, tokens: int) -> dict[str, Any]:
        return {
            "placement": "fixed", "cache": "off", "block": 0, "session_id": session,
            "replica": replica, "send_s": t, "e2e_s": 0.1, "prompt_tokens": tokens,
        }  # fmt: skip

    run = make_run(
        [
            req("a", 0, 0.0, 100),
            req("b", 0, 1.0, 300),
            req("c", 1, 1.5, 999),  # another replica: does not count
            req("b", 0, 2.0, 320),
            req("a", 0, 3.0, 150),
        ]
    )
    dist = load.reuse_distance(run).sort("send_s")["reuse_distance_tokens"].to_list()
    assert dist == [None, None, None, 0, 300 + 320]


def test_working_set_peaks_over_live_sessions_and_per_replica() -> None:
    def req(session: str, replica: int, t: float, end: float, tokens: int) -> dict[str, Any]:
        return {
            "placement": "fixed", "cache": "off", "block": 0, "session_id": session,
            "replica": replica, "send_s": t, "e2e_s": end - t, "prompt_tokens": tokens,
        }  # fmt: skip

    run = make_run(
        [
            req("a", 0, 0.0, 1.0, 1000),
            req("b", 1, 0.5, 1.5, 2000),
            req("a", 0, 2.0, 3.0, 1100),  # a's next turn: b has ended (1.5)
            req("c", 0, 2.5, 3.5, 500),
        ]
    )
    ws = load.working_set(run).row(0, named=True)
    assert ws["peak_tokens"] == 3000  # a (1000) + b (2000) at 0.5 s
    assert ws["peak_replica_tokens"] == 2000  # b on replica 1


def test_a_run_without_load_columns_is_one_level() -> None:
    rows = [{**r, "load_level": None} for r in level_rows(1.0, "off", [1.0] * 3)]
    table = load.load_table(make_run(rows), ttft_s=2.0)
    assert table["load_level"].to_list() == [1.0] and table["turns"].to_list() == [3]


def test_levels_apart_keeps_each_level_its_own_arm() -> None:
    """The same sessions replayed at two levels: per-arm medians must not pool them."""
    rows = level_rows(1.0, "off", [1.0] * 5) + level_rows(8.0, "off", [9.0] * 5)
    run = make_run(rows)
    apart = run.levels_apart()
    medians = dict(apart.requests.group_by("placement").agg(pl.col("ttft_s").median()).iter_rows())
    assert medians == {"fixed @ 1": 1.0, "fixed @ 8": 9.0}
    single = make_run(level_rows(4.0, "off", [2.0] * 3))
    assert single.levels_apart() is single


def _queue_rows(level: float, cache: str, growth: float, n: int = 60) -> list[dict[str, Any]]:
    """Sessions scheduled to start once a second whose TTFT grows ``growth`` seconds per
    second of arrivals (a backlog over capacity) above a noisy base (seeded)."""
    rng = np.random.default_rng(7)
    base = rng.uniform(0.2, 0.4, size=n)
    rows = level_rows(level, cache, [float(b + growth * i) for i, b in enumerate(base)])
    return [{**r, "arrival_s": r["send_s"]} for r in rows]


def test_growing_backlog_is_unstable_and_steady_load_is_not() -> None:
    rows = _queue_rows(4.0, "off", 0.5) + _queue_rows(1.0, "off", 0.0)
    table = load.load_table(make_run(rows), ttft_s=None).sort("load_level")
    steady, growing = table.to_dicts()
    assert growing["ttft_growth"] == pytest.approx(0.5, abs=0.02)
    assert not growing["stable"]
    assert abs(steady["ttft_growth"]) < 0.01 and steady["stable"]


def test_growth_follows_scheduled_starts_not_sends() -> None:
    # Backlogged sessions all start in 10 s; their turns are sent over 600 s as the
    # backlog drains, so against send times TTFT would barely move (1.2 s per 10 s
    # sent, 0.002 per second), against the starts it grows by 0.12 per second.
    rows = [
        {**r, "arrival_s": i / 6, "send_s": 10.0 * i, "ttft_s": 0.3 + 0.02 * i}
        for i, r in enumerate(_queue_rows(2.0, "off", 0.0))
    ]
    [row] = load.load_table(make_run(rows), ttft_s=None).to_dicts()
    assert row["ttft_growth"] == pytest.approx(0.12, abs=0.01) and not row["stable"]


def test_closed_loop_and_few_turns_say_nothing_about_growth() -> None:
    closed = [{**r, "arrival_s": None} for r in _queue_rows(1.0, "off", 1.0)]
    few = _queue_rows(2.0, "off", 1.0, 8)
    for rows in (closed, few):
        [row] = load.load_table(make_run(rows), ttft_s=None).to_dicts()
        assert row["ttft_growth"] is None and row["stable"]


def test_open_loop_serving_under_half_the_offered_turns_is_unstable() -> None:
    # Steady TTFT (batching slows everyone alike), but 60 turns over 60 s against an
    # offered 2 sessions/s x 3 turns = 6 turns/s: throughput 1/6 of the offer.
    rows = _queue_rows(2.0, "off", 0.0)
    scenario = {"load": {"arrival": "poisson"}, "sessions": {"turns": 3}}
    meta = RunMeta.from_manifest({"run_id": "x", "scenario": scenario})
    run = make_run(rows)
    [row] = load.load_table(Run(run.path, meta, run.requests), ttft_s=None).to_dicts()
    assert row["offered_turns_s"] == 6.0 and not row["stable"]
    [closed] = load.load_table(run, ttft_s=None).to_dicts()
    assert closed["offered_turns_s"] is None and closed["stable"]
