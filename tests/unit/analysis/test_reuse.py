"""A replayed trace's reuse (sessiongen.analysis.reuse) on small frames computed by hand.

The trace (10-token blocks):

    line 1  ids [1, 2, 3]     30 tokens  shares nothing
    line 2  ids [1, 2, 4]     25 tokens  shares [1, 2]     -> 20 tokens, LRU distance 2
    line 3  ids [1, 5]        20 tokens  shares [1]        -> 10 tokens, distance 2
    line 4  ids [1, 2, 3, 6]  35 tokens  shares [1, 2, 3]  -> 30 tokens, distance 4

Line 4's block 3 was last referenced at line 1; since then 1, 2, 4, 5 were referenced:
distance 4 (blocks 1 and 2 have 1 and 3). Sent at t = 0, 1, 2, 3; lines 1 and 2 (session
a) to replica 0, line 3 (session b) and line 4 (session c) to replica 1.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from sessiongen.analysis import reuse
from sessiongen.workload.reuse import prefix_facts
from sessiongen.workload.trace import TraceRequest

BT = 10
IDS = {1: [1, 2, 3], 2: [1, 2, 4], 3: [1, 5], 4: [1, 2, 3, 6]}
LENGTH = {1: 30, 2: 25, 3: 20, 4: 35}
SHARED = {1: 0, 2: 20, 3: 10, 4: 30}
DISTANCE = {1: None, 2: 2, 3: 2, 4: 4}


def lines() -> pl.DataFrame:
    return pl.DataFrame(
        {"trace_line": list(IDS), "hash_ids": list(IDS.values())},
        schema={"trace_line": pl.Int64(), "hash_ids": pl.List(pl.Int64())},
    )


def request(line: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "block": 0,
        "placement": "alternate",
        "cache": "on",
        "session_id": {1: "a", 2: "a", 3: "b", 4: "c"}[line],
        "replica": {1: 0, 2: 0, 3: 1, 4: 1}[line],
        "send_s": float(line - 1),
        "status": "ok",
        "trace_line": line,
        "content_tokens": LENGTH[line],
        "trace_shared_tokens": SHARED[line],
        "trace_reuse_distance": DISTANCE[line],
        "local_hit_tokens": {1: 0, 2: 20, 3: 0, 4: 10}[line],
        "external_hit_tokens": {1: 0, 2: 0, 3: 0, 4: 25}[line],
    }
    row.update(over)
    return row


SCHEMA = {
    "block": pl.Int32(),
    "replica": pl.Int32(),
    "trace_line": pl.Int64(),
    "content_tokens": pl.Int64(),
    "trace_shared_tokens": pl.Int64(),
    "trace_reuse_distance": pl.Int32(),
    "local_hit_tokens": pl.Int64(),
    "external_hit_tokens": pl.Int64(),
}


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema_overrides=SCHEMA)


def requests(**over: Any) -> pl.DataFrame:
    return frame([request(line, **over) for line in IDS])


def test_the_hand_computed_trace_agrees_with_the_replay_facts() -> None:
    """The module docstring's figures are what the replay records (workload.reuse)."""
    reqs = [TraceRequest(n, 0.0, LENGTH[n], 1, tuple(IDS[n]), None, None) for n in IDS]
    facts = [f for _, f in prefix_facts(reqs, BT)]
    assert [f.shared_tokens for f in facts] == list(SHARED.values())
    assert [f.reuse_distance for f in facts] == list(DISTANCE.values())


def test_leading_seen_tokens_counts_leading_blocks_and_caps_the_partial_last() -> None:
    assert reuse.leading_seen_tokens(list(IDS.values()), list(LENGTH.values()), BT) == [
        0,
        20,
        10,
        30,
    ]
    # every block seen, the prompt shorter than its blocks: its own length
    assert reuse.leading_seen_tokens([[7, 8], [7, 8]], [20, 15], BT) == [0, 15]
    # a block seen after an unseen one is not leading
    assert reuse.leading_seen_tokens([[1, 2], [3, 2]], [20, 20], BT) == [0, 0]


def test_replica_reuse_counts_only_blocks_sent_earlier_to_the_same_replica() -> None:
    rows = reuse.with_replica_reuse(requests(), lines(), BT).sort("trace_line")
    # line 2 finds [1, 2] of line 1 on replica 0; line 4 finds only [1] of line 3 on 1
    assert rows["replica_shared_tokens"].to_list() == [0, 20, 0, 10]
    # send order, not file order: line 4 sent before line 3 on replica 1
    swapped = frame([request(n, send_s={1: 0.0, 2: 1.0, 3: 3.0, 4: 2.0}[n]) for n in IDS])
    rows = reuse.with_replica_reuse(swapped, lines(), BT).sort("trace_line")
    assert rows["replica_shared_tokens"].to_list() == [0, 20, 10, 0]


def test_an_unknown_replica_leaves_the_replica_share_unknown() -> None:
    unknown = frame([request(n, replica=None) if n == 3 else request(n) for n in IDS])
    rows = reuse.with_replica_reuse(unknown, lines(), BT)
    arm = reuse.arm_reuse(rows).row(0, named=True)
    assert arm["replica_share"] is None
    assert arm["infinite_share"] == pytest.approx(60 / 110)


def test_arm_shares_and_what_the_pool_recovered() -> None:
    rows = reuse.with_replica_reuse(requests(), lines(), BT)
    arm = reuse.arm_reuse(rows).row(0, named=True)
    assert arm["prompt_tokens"] == 110
    assert arm["infinite_share"] == pytest.approx(60 / 110)
    assert arm["replica_share"] == pytest.approx(30 / 110)
    assert arm["local_share"] == pytest.approx(30 / 110)
    assert arm["pool_share"] == pytest.approx(25 / 110)
    # beyond local: line 3 10 - 0, line 4 30 - 10; recovered: line 4 min(25, 20)
    assert arm["beyond_local_tokens"] == 30
    assert arm["recovered_tokens"] == 20
    assert arm["recovered_share"] == pytest.approx(20 / 30)
    # two sessions with reuse beyond the local hits: no interval
    assert arm["recovered_low"] is None and arm["recovered_high"] is None
    assert (arm["sessions"], arm["requests"], arm["blocks"]) == (3, 4, 1)


def test_failed_requests_and_warmups_do_not_count() -> None:
    rows = [request(n, status="error") if n == 4 else request(n) for n in IDS]
    rows.append(request(1, trace_line=None, session_id="warm"))
    arm = reuse.arm_reuse(reuse.with_replica_reuse(frame(rows), lines(), BT)).row(0, named=True)
    assert arm["prompt_tokens"] == 75 and arm["infinite_share"] == pytest.approx(30 / 75)


def test_the_recovered_share_has_an_interval_over_sessions() -> None:
    # six sessions, each two lines on alternating replicas; pool recovers 2 of 3 halves
    rows = []
    for s in range(6):
        for turn in (1, 2):
            rows.append(
                request(
                    1,
                    session_id=f"s{s}",
                    trace_line=10 * s + turn,
                    send_s=float(2 * s + turn),
                    trace_shared_tokens=0 if turn == 1 else 20,
                    local_hit_tokens=0,
                    external_hit_tokens=0 if turn == 1 else (20 if s % 3 else 0),
                )
            )
    arm = reuse.arm_reuse(frame(rows).with_columns(replica_shared_tokens=pl.lit(0))).row(
        0, named=True
    )
    assert arm["recovered_share"] == pytest.approx(80 / 120)
    assert arm["recovered_low"] < arm["recovered_share"] < arm["recovered_high"]
    # the interval resamples the six sessions with reuse beyond the local hits
    assert arm["interval_units"] == 6 and not arm["one_request_sessions"]


def test_the_interval_counts_the_units_it_resamples_not_every_session() -> None:
    """Twelve one-request sessions, six with reuse beyond the local hits: the interval's
    units are those six (the reported "over 12031 sessions" had 4,250 behind it)."""
    rows = [
        request(1, session_id=f"s{s}", trace_line=s, send_s=float(s),
                trace_shared_tokens=20 if s % 2 else 0, local_hit_tokens=0,
                external_hit_tokens=20 if s % 4 == 1 else 0)
        for s in range(12)
    ]  # fmt: skip
    arm = reuse.arm_reuse(frame(rows).with_columns(replica_shared_tokens=pl.lit(0))).row(
        0, named=True
    )
    assert (arm["sessions"], arm["interval_units"]) == (12, 6)
    assert arm["one_request_sessions"]


def test_the_pool_is_read_against_the_beyond_local_bound_not_unbounded_caches() -> None:
    """A replica that saw a block and evicted it: unbounded local caches would have served
    it (replica share 30/110), but the local hit was 0 and the pool served it, so the pool
    share exceeds infinite - replica share; the pool-within share stays within the
    beyond-local share, and template tokens (pool hits beyond the trace's shared
    tokens) count in the pool share only."""
    rows = reuse.with_replica_reuse(requests(), lines(), BT)
    evicted = rows.with_columns(
        local_hit_tokens=pl.lit(0, pl.Int64),
        external_hit_tokens=pl.col("trace_shared_tokens").fill_null(0) + 5,
    )
    arm = reuse.arm_reuse(evicted).row(0, named=True)
    assert arm["pool_share"] > arm["infinite_share"] - arm["replica_share"]
    assert arm["beyond_local_share"] == pytest.approx(60 / 110)
    assert arm["pool_within_share"] == pytest.approx(60 / 110)
    assert arm["pool_within_share"] <= arm["beyond_local_share"] < arm["pool_share"]


def test_the_trace_figures_count_each_line_once_over_blocks() -> None:
    both = pl.concat([requests(), requests(block=1, cache="off")])
    assert reuse.trace_totals(both) == {
        "requests": 4,
        "prompt_tokens": 110,
        "infinite_tokens": 60,
        "infinite_share": pytest.approx(60 / 110),
    }


def test_reuse_distance_histogram_quantiles_and_lru_share() -> None:
    rows = requests()
    hist = reuse.distance_histogram(rows)
    assert hist.to_dicts() == [
        {"distance_blocks": "2-3", "low": 2, "requests": 2, "shared_tokens": 30},
        {"distance_blocks": "4-7", "low": 4, "requests": 1, "shared_tokens": 30},
    ]
    assert reuse.distance_quantiles(rows) == {
        "sharing_requests": 3,
        "p50": 2.0,
        "p90": 4.0,
        "max": 4.0,
    }
    # an LRU cache of C blocks keeps a shared prefix whose distance is below C
    assert reuse.lru_share(rows, 2) == 0.0
    assert reuse.lru_share(rows, 3) == pytest.approx(0.5)
    assert reuse.lru_share(rows, 5) == 1.0
    bins = reuse.distance_histogram(
        frame(
            [request(2, trace_line=n, trace_reuse_distance=d) for n, d in enumerate((0, 1, 5, 9))]
        )
    )
    assert bins["distance_blocks"].to_list() == ["0", "1", "4-7", "8-15"]


def test_nothing_shared_is_not_enough_data() -> None:
    cold = frame([request(1)])
    assert reuse.distance_histogram(cold).is_empty()
    assert reuse.lru_share(cold, 10) is None
    assert reuse.distance_quantiles(cold)["p50"] is None


def test_working_set_in_a_sliding_window_and_the_footprint() -> None:
    ws = reuse.working_set(requests(), lines(), window_s=1.5)
    # t=0 {1,2,3}; t=1 adds 4; t=2 drops line 1: {1,2,4,5}; t=3 lines 3, 4: {1,2,3,5,6}
    assert ws["all_blocks"].to_list() == [3, 4, 4, 5]
    # busiest replica: r0 {1,2,3}, {1,2,3,4}, {1,2,4} (r1 {1,5}), r1 {1,2,3,5,6}
    assert ws["replica_blocks"].to_list() == [3, 4, 3, 5]
    assert ws["t_s"].to_list() == [0.0, 1.0, 2.0, 3.0]
    default = reuse.working_set(requests(), lines())
    assert default["window_s"].to_list() == [pytest.approx(0.3)] * 4
    assert default["all_blocks"].to_list() == [3, 3, 2, 4]  # each send alone
    fp = reuse.footprint(requests(), lines())
    assert fp.select("all_blocks", "replica_blocks").row(0) == (6, 5)


def test_working_set_of_a_single_send_is_its_blocks() -> None:
    ws = reuse.working_set(frame([request(4)]), lines())
    assert ws["all_blocks"].to_list() == [4]
