"""The scheduler against hand-computed schedules, on the virtual clock (exact, no wall time).

The profile below makes the arithmetic easy: prefill costs 1 ms a token (no attention
term unless a test adds one), the decode part of a step is 10 ms plus 1 ms per other
sequence, the pool moves 1 token a millisecond with no fixed cost, KV blocks hold 10
tokens, pool chunks 20, and a step's budget is 100 tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.scheduler import Step
from sessiongen.sim.virtual import Arrival, RequestResult, VirtualDriver


def profile(**changes: Any) -> SimProfile:
    base: dict[str, Any] = {
        "replicas": 1,
        "time_scale": 1.0,
        "max_model_len": 1000,
        "max_num_batched_tokens": 100,
        "local_block_tokens": 10,
        "local_cache_tokens": 1000,
        "pool_chunk_tokens": 20,
        "kv_bytes_per_token": 1000,
        "pool_bandwidth_gbps": 1e-3,  # 1e6 bytes/s: 1 ms per token
        "pool_load_fixed_s": 0.0,
        "prefill_s_per_ktok": 1.0,
        "attn_s_per_ktok2": 0.0,
        "hit_overhead_tokens": (0,),
        "hit_overhead_s": (0.0,),
        "itl_base_s": 0.01,
        "itl_per_ktok_s": 0.0,
        "itl_per_batch_s": 0.001,
    }
    base.update(changes)
    return SimProfile(**base)


def tokens(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint32)


class Traced(VirtualDriver):
    """A virtual driver that keeps every step: (replica, start, end, work, admitted,
    preempted), with requests named by their tags."""

    def __init__(self, p: SimProfile, **kwargs: Any) -> None:
        super().__init__(p, engine="python", **kwargs)  # the one that tells of its steps
        self.trace: list[tuple[int, float, float, list[tuple[Any, int]], list[Any], list[Any]]]
        self.trace = []

    def step_ended(self, replica: int, step: Step) -> None:
        self.trace.append(
            (
                replica,
                step.start,
                step.end,
                [(r.tag, n) for r, n in step.work],
                [r.tag for r in step.admitted],
                [r.tag for r in step.preempted],
            )
        )
        super().step_ended(replica, step)


def by_tag(results: list[RequestResult]) -> dict[Any, RequestResult]:
    return {r.tag: r for r in results}


def test_two_requests_share_one_step_budget() -> None:
    d = Traced(profile())
    d.submit(Arrival(0.0, 0, tokens(0, 60), 2, tag="A"))
    d.submit(Arrival(0.0, 0, tokens(1000, 60), 1, tag="B"))
    r = by_tag(d.run())
    # Step 1: A's 60 tokens and B's first 40 (the budget's rest); A samples: 10 ms.
    # Step 2: A's decode and B's last 20 tokens; both sample: 10 + 1 ms.
    assert [(s[1], s[3]) for s in d.trace] == [
        (0.0, [("A", 60), ("B", 40)]),
        (pytest.approx(0.11), [("A", 1), ("B", 20)]),
    ]
    assert r["A"].ttft_s == pytest.approx(0.060 + 0.040 + 0.010)
    assert r["B"].ttft_s == pytest.approx(0.11 + 0.020 + 0.011)
    assert r["A"].e2e_s == r["B"].e2e_s == pytest.approx(0.141)
    assert r["A"].queue_s == r["B"].queue_s == 0


@pytest.mark.parametrize("collapse", [False, True])
def test_a_long_prompt_is_chunked_around_a_running_decode(collapse: bool) -> None:
    d = Traced(profile(attn_s_per_ktok2=1.0), collapse=collapse)
    d.submit(Arrival(0.0, 0, tokens(0, 30), 5, tag="A"))
    d.submit(Arrival(0.05, 0, tokens(1000, 250), 1, tag="B"))
    r = by_tag(d.run())
    # B arrives during A's second step and joins at its end. The decode goes first,
    # B gets the other 99 tokens of each step; attention is paid on what came before.
    ends = [0.0309 + 0.01, 0.0509]
    ends.append(ends[-1] + 0.099 + 0.099**2 + 0.01)
    ends.append(ends[-1] + 0.099 + (0.198**2 - 0.099**2) + 0.01)
    ends.append(ends[-1] + 0.052 + (0.25**2 - 0.198**2) + 0.011)
    assert [s[3] for s in d.trace] == [
        [("A", 30)],
        [("A", 1)],
        [("A", 1), ("B", 99)],
        [("A", 1), ("B", 99)],
        [("A", 1), ("B", 52)],
    ]
    assert [s[2] for s in d.trace] == pytest.approx(ends)
    assert r["B"].queue_s == pytest.approx(0.0509 - 0.05)
    assert r["B"].first_token_s == r["A"].finished_s == pytest.approx(ends[-1])
    # The chunks' prefill adds up to one cold prefill of 250 tokens: 0.25 + 0.25^2 s.
    prefill = ends[-1] - ends[1] - 3 * 0.01 - 0.001
    assert prefill == pytest.approx(0.25 + 0.0625)


@pytest.mark.parametrize("collapse", [False, True])
def test_head_of_line_blocking_when_kv_blocks_are_short(collapse: bool) -> None:
    # 10 blocks of 10 tokens. A holds 6 to 8 of them while it decodes.
    d = Traced(profile(local_cache_tokens=100, max_model_len=100), collapse=collapse)
    d.submit(Arrival(0.0, 0, tokens(0, 55), 20, tag="A"))
    d.submit(Arrival(0.1, 0, tokens(1000, 50), 1, tag="B"))  # needs 5 blocks
    d.submit(Arrival(0.12, 0, tokens(2000, 5), 1, tag="C"))  # needs 1: fits, but waits
    r = by_tag(d.run())
    a_end = 0.055 + 0.01 + 19 * 0.01
    assert r["A"].finished_s == pytest.approx(a_end)
    assert r["B"].admitted_s == r["C"].admitted_s == pytest.approx(a_end)
    assert r["B"].queue_s == pytest.approx(a_end - 0.1)
    assert r["C"].queue_s == pytest.approx(a_end - 0.12)
    # Both prefill in one step: 55 tokens, then two sequences sample.
    assert r["B"].first_token_s == r["C"].first_token_s == pytest.approx(a_end + 0.066)
    assert r["B"].kv_blocks_at_admission == 0 and r["B"].waiting_at_admission == 1


def test_lru_eviction_takes_the_least_recent_request_tail_first() -> None:
    d = VirtualDriver(profile(local_cache_tokens=100, max_model_len=100), shared_cache=False)
    t = 0.0

    def ask(ids: np.ndarray, tag: str) -> RequestResult:
        nonlocal t
        d.submit(Arrival(t, 0, ids, 1, tag=tag))
        result = d.run()[-1]
        t = result.finished_s + 1
        return result

    x, y, z = tokens(0, 40), tokens(1000, 30), tokens(2000, 50)
    ask(x, "X")
    ask(y, "Y")
    ask(z, "Z")  # 5 blocks: 3 never used, then X's last 2 (X is least recent)
    assert ask(np.concatenate([x, tokens(9000, 5)]), "X2").local_hit_tokens == 20
    # X2 needed 3 blocks: Y, least recent now, lost all three (X's head was in use).
    assert ask(np.concatenate([y, tokens(9100, 5)]), "Y2").local_hit_tokens == 0
    # Y2 needed 4 blocks, 1 free: Z's tail went, three of its five blocks.
    assert ask(np.concatenate([z, tokens(9200, 5)]), "Z2").local_hit_tokens == 20


def test_a_prompt_seen_whole_hits_all_but_its_last_token_block_aligned() -> None:
    d = VirtualDriver(profile(), shared_cache=False)
    d.submit(Arrival(0.0, 0, tokens(0, 40), 1))
    d.submit(Arrival(1.0, 0, tokens(0, 40), 1))
    d.submit(Arrival(2.0, 0, tokens(0, 41), 1))
    assert [r.local_hit_tokens for r in d.run()] == [0, 30, 40]


def test_preemption_recomputes_the_latest_admitted_request() -> None:
    d = Traced(profile(local_cache_tokens=100, max_model_len=100), shared_cache=False)
    d.submit(Arrival(0.0, 0, tokens(0, 40), 30, tag="A"))
    d.submit(Arrival(0.0, 0, tokens(1000, 40), 30, tag="B"))
    r = by_tag(d.run())
    # Step 1: both prefill (8 blocks), then both decode, 10 blocks from their 41st
    # token on. At the 51st, A needs an 11th block: B, admitted last, is preempted.
    both = 0.080 + 0.011 + 10 * 0.011
    preempting = [s for s in d.trace if s[5]]
    assert len(preempting) == 1
    _replica, start, end, work, _admitted, preempted = preempting[0]
    assert end == pytest.approx(both + 0.010)  # A alone now: one sequence samples
    assert (start, work, preempted) == (pytest.approx(both), [("A", 1)], ["B"])
    # B waits (head of line: 4 of its blocks are cached, but it needs 2 more) until A
    # ends; by then A's 7th block has evicted B's 4th. B recomputes 51 - 30 tokens.
    a_end = both + 19 * 0.010
    assert r["A"].finished_s == pytest.approx(a_end) and r["A"].preemptions == 0
    readmitted = [s for s in d.trace if "B" in s[4]][-1]
    assert readmitted[1] == pytest.approx(a_end) and readmitted[3] == [("B", 21)]
    assert r["B"].preemptions == 1
    assert r["B"].first_token_s == pytest.approx(0.091)  # its first admission's token
    assert r["B"].finished_s == pytest.approx(a_end + 0.021 + 0.010 + 18 * 0.010)


def pool_profile(replicas: int = 3, **changes: Any) -> SimProfile:
    return profile(replicas=replicas, pool_load_fixed_s=0.005, **changes)


def two_loads(second_at: float) -> tuple[float, float]:
    """TTFTs of two cross-replica hits of 200 tokens each, at 1.0 and ``second_at``."""
    d = VirtualDriver(pool_profile())
    x, y = tokens(0, 200), tokens(1000, 200)
    d.submit(Arrival(0.0, 0, x, 1))  # both stored by replica 0 first
    d.submit(Arrival(0.3, 0, y, 1))
    d.submit(Arrival(1.0, 1, np.concatenate([x, [7]]), 1, tag="X1"))
    d.submit(Arrival(second_at, 2, np.concatenate([y, [7]]), 1, tag="Y2"))
    r = by_tag(d.run())
    assert r["X1"].pool_hit_tokens == r["Y2"].pool_hit_tokens == 200
    return r["X1"].ttft_s, r["Y2"].ttft_s


def test_pool_bandwidth_is_shared_by_replicas_loading_at_once() -> None:
    # Each load: 5 ms fixed, then 200 ms on the link; then the last token's prefill
    # and the first token.
    alone = 0.005 + 0.200 + 0.001 + 0.010
    assert two_loads(second_at=2.0) == pytest.approx((alone, alone))
    # At once: the second waits for the first's 200 ms on the link.
    assert two_loads(second_at=1.0) == pytest.approx((alone, alone + 0.200))
    # Ready at 1.105 (after its fixed cost), the link is busy until 1.205.
    assert two_loads(second_at=1.1) == pytest.approx((alone, alone + 0.100))


def test_pool_chunks_are_visible_after_the_step_that_computed_them() -> None:
    d = VirtualDriver(pool_profile(replicas=4))
    x = tokens(0, 200)  # two steps of 100 tokens: 5 chunks after the first (at 0.1)
    d.submit(Arrival(0.0, 0, x, 1, tag="X"))
    d.submit(Arrival(0.05, 1, np.concatenate([x, [1]]), 1, tag="early"))
    d.submit(Arrival(0.15, 2, np.concatenate([x, [2]]), 1, tag="middle"))
    r = by_tag(d.run())
    d.submit(Arrival(1.0, 3, np.concatenate([x, [3]]), 1, tag="late"))
    r |= by_tag(d.run())
    assert [r[k].pool_hit_tokens for k in ("early", "middle", "late")] == [0, 100, 200]


@pytest.mark.parametrize("live", [True, False])
def test_answer_blocks_are_reused_by_the_next_turn_on_the_same_replica(live: bool) -> None:
    p = pool_profile()
    rng = np.random.default_rng(1)
    prompt, question = tokens(0, 100), tokens(5000, 10)
    answer = rng.integers(20_000, 30_000, 25)
    d = VirtualDriver(p)
    second = np.concatenate([prompt, answer, question])

    def next_turn(result: RequestResult) -> None:
        if result.tag == "turn1":  # elsewhere first, then on the same replica
            for replica, later in ((1, 1.0), (0, 2.0)):
                at = result.finished_s + later
                d.submit(Arrival(at, replica, second, 5, tag=f"turn2@{replica}"))

    d.on_finish = next_turn
    d.submit(Arrival(0.0, 0, prompt, 25, output_ids=answer if live else None, tag="turn1"))
    r = by_tag(d.run())
    # The answer's last token never enters the KV cache: 124 tokens, 12 whole blocks.
    assert r["turn2@0"].local_hit_tokens == (120 if live else 100)
    # The pool holds prompt chunks only (LMCache does not save decoded tokens).
    assert r["turn2@1"].local_hit_tokens == 0 and r["turn2@1"].pool_hit_tokens == 100


def prefill_run(collapse: bool) -> tuple[list[float], dict[Any, RequestResult]]:
    """A 900-token prompt (steps of 99 tokens beside a decode) on replica 0; replicas 1
    to 4 ask for its prefix at times inside its prefill."""
    d = Traced(pool_profile(replicas=5, attn_s_per_ktok2=1.0), collapse=collapse)
    x = tokens(0, 900)
    d.submit(Arrival(0.0, 0, tokens(5000, 30), 40, tag="decode"))
    d.submit(Arrival(0.05, 0, x, 1, tag="X"))
    for i, at in enumerate((0.2, 0.45, 0.7, 0.95)):
        d.submit(Arrival(at, 1 + i, np.concatenate([x, [i]]), 1, tag=at))
    r = by_tag(d.run())
    return [s[2] for s in d.trace if s[0] == 0], r


def test_a_collapsed_prefill_run_keeps_every_boundary_and_pool_chunk_time() -> None:
    stepped_ends, stepped = prefill_run(collapse=False)
    collapsed_ends, collapsed = prefill_run(collapse=True)
    assert len(collapsed_ends) < len(stepped_ends) / 2
    assert set(np.round(collapsed_ends, 9)) <= set(np.round(stepped_ends, 9))
    for tag, x in stepped.items():
        y = collapsed[tag]
        assert x.pool_hit_tokens == y.pool_hit_tokens
        assert x.first_token_s == pytest.approx(y.first_token_s)
    hits = [stepped[at].pool_hit_tokens for at in (0.2, 0.45, 0.7, 0.95)]
    assert hits == sorted(hits) and 0 < hits[0] < hits[-1] < 900


def sessions_workload(collapse: bool, **changes: Any) -> tuple[list[RequestResult], int]:
    """Sessions with think time and live answers on 2 replicas, a small KV cache."""
    p = profile(
        replicas=2,
        local_cache_tokens=600,
        max_model_len=600,
        max_num_batched_tokens=64,
        itl_per_ktok_s=0.5,
        attn_s_per_ktok2=0.5,
        pool_load_fixed_s=0.002,
        **changes,
    )
    rng = np.random.default_rng(7)
    d = VirtualDriver(p, collapse=collapse)

    def turn(s: int, k: int, at: float, prompt: np.ndarray) -> None:
        answer = rng.integers(0, 50_000, int(rng.integers(5, 60)))
        tag = (s, k, prompt, answer)
        d.submit(Arrival(at, (s + k) % 2, prompt, len(answer), output_ids=answer, tag=tag))

    def follow(result: RequestResult) -> None:
        s, k, prompt, answer = result.tag
        if k < 4:
            nxt = np.concatenate([prompt, answer, rng.integers(0, 50_000, 8)])
            turn(s, k + 1, result.finished_s + float(rng.exponential(0.3)), nxt)

    d.on_finish = follow
    for s in range(12):
        turn(s, 1, 0.05 * s, rng.integers(0, 50_000, int(rng.integers(50, 200))))
    return d.run(), d.cluster.events


LOADED_TERMS = [
    {},
    {"pool_store_s_per_gb": 50.0},
    {"pool_load_mode": "async", "pool_store_s_per_gb": 50.0},
]


@pytest.mark.parametrize("changes", LOADED_TERMS, ids=["default", "store", "async+store"])
def test_collapsing_decode_runs_changes_nothing_but_the_event_count(
    changes: dict[str, Any],
) -> None:
    stepped, stepped_events = sessions_workload(collapse=False, **changes)
    collapsed, collapsed_events = sessions_workload(collapse=True, **changes)
    key = lambda r: (r.tag[0], r.tag[1])  # noqa: E731
    a, b = sorted(stepped, key=key), sorted(collapsed, key=key)
    assert len(a) == len(b) == 48
    assert sum(r.preemptions for r in a) > 0  # the cache is small enough to preempt
    for x, y in zip(a, b, strict=True):
        assert key(x) == key(y)
        assert (x.local_hit_tokens, x.pool_hit_tokens, x.preemptions) == (
            y.local_hit_tokens,
            y.pool_hit_tokens,
            y.preemptions,
        )
        assert (x.first_token_s, x.finished_s) == pytest.approx(
            (y.first_token_s, y.finished_s), rel=1e-9
        )
    assert collapsed_events < stepped_events / 3


def test_the_virtual_driver_refuses_what_cannot_be_simulated() -> None:
    d = VirtualDriver(profile(local_cache_tokens=100, max_model_len=100))
    with pytest.raises(ValueError, match="max_model_len"):
        d.submit(Arrival(0.0, 0, tokens(0, 90), 20))
    with pytest.raises(ValueError, match="replica"):
        d.submit(Arrival(0.0, 3, tokens(0, 10), 1))
    d.submit(Arrival(1.0, 0, tokens(0, 10), 1))
    d.run()
    with pytest.raises(ValueError, match="before now"):
        d.submit(Arrival(0.5, 0, tokens(0, 10), 1))
    keys = d.keys(tokens(100, 140))
    short = keys.local.extend_unique(5, np.zeros((40 % 16 + 5) // 16, dtype=np.uint64))
    with pytest.raises(ValueError, match="answer: expected"):
        d.submit(Arrival(2.0, 0, keys, 6, answer=short))


# --- the loaded terms: the pool's store cost, asynchronous loads ------------------------


@pytest.mark.parametrize("pool_on", [False, True])
def test_storing_computed_kv_costs_its_step_only_with_the_pool_on(pool_on: bool) -> None:
    # 100 tokens x 1000 bytes = 1e-4 GB at 100 s/GB: 10 ms in the step that computes them.
    p = profile(pool_store_s_per_gb=100.0)
    d = Traced(p, shared_cache=pool_on)
    d.submit(Arrival(0.0, 0, tokens(0, 150), 1, tag="A"))  # steps of 100 and 50 tokens
    r = by_tag(d.run())
    store = 0.010 + 0.005 if pool_on else 0.0
    assert r["A"].ttft_s == pytest.approx(0.150 + 0.010 + store)
    assert [round(end - start, 9) for _r, start, end, *_ in d.trace] == pytest.approx(
        [0.100 + (0.010 if pool_on else 0.0), 0.050 + 0.010 + (0.005 if pool_on else 0.0)]
    )


def decode_beside_a_load(mode: str, with_load: bool = True) -> dict[Any, RequestResult]:
    """Replica 0 stores 200 tokens; on replica 1 a request decodes 100 tokens from 0.5 s
    while another arrives at 1.0 s and finds those 200 tokens in the pool."""
    d = VirtualDriver(pool_profile(replicas=2, pool_load_mode=mode))
    x = tokens(0, 200)
    d.submit(Arrival(0.0, 0, x, 1, tag="X"))
    d.submit(Arrival(0.5, 1, tokens(5000, 30), 100, tag="D"))
    if with_load:
        d.submit(Arrival(1.0, 1, np.concatenate([x, [7]]), 1, tag="Y"))
    return by_tag(d.run())


def test_a_synchronous_load_holds_the_decodes_in_its_step_and_an_asynchronous_one_does_not() -> (
    None
):
    load = 0.005 + 0.200  # fixed cost, then 200 tokens on the link
    alone = decode_beside_a_load("sync", with_load=False)["D"].finished_s
    sync, later = decode_beside_a_load("sync"), decode_beside_a_load("async")
    assert sync["Y"].pool_hit_tokens == later["Y"].pool_hit_tokens == 200
    # Sync: D's step at Y's admission waits for the load (plus Y's 1-token prefill and
    # one more sequence in the batch).
    assert sync["D"].finished_s - alone == pytest.approx(load + 0.001 + 0.001, abs=2e-3)
    # Async: D never waits for it; Y joins the first step after its load, then one step.
    assert later["D"].finished_s - alone == pytest.approx(0.002, abs=1.5e-3)
    assert load + 0.011 < later["Y"].ttft_s < load + 0.011 + 0.012
    assert later["Y"].admitted_s == pytest.approx(sync["Y"].admitted_s)


def test_an_asynchronous_load_alone_on_its_replica_takes_as_long_as_a_synchronous_one() -> None:
    def alone(mode: str) -> float:
        d = VirtualDriver(pool_profile(replicas=2, pool_load_mode=mode))
        x = tokens(0, 200)
        d.submit(Arrival(0.0, 0, x, 1))
        d.submit(Arrival(1.0, 1, np.concatenate([x, [7]]), 1, tag="Y"))
        return by_tag(d.run())["Y"].ttft_s

    assert alone("async") == pytest.approx(alone("sync")) == pytest.approx(0.216)
