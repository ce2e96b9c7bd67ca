"""Prefix-sharing facts: shared leading blocks and LRU stack distances, against brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sessiongen.workload.reuse import PrefixFacts, prefix_facts
from sessiongen.workload.trace import TraceRequest


def req(ids: list[int], n: int) -> TraceRequest:
    return TraceRequest(0, 0.0, n, 1, tuple(ids), None, None)


def brute(requests: list[TraceRequest], block: int) -> list[PrefixFacts]:
    """Distinct blocks between two references to a block, counted by hand."""
    refs: list[int] = []
    out = []
    for r in requests:
        shared, leading, worst = 0, True, None
        for h in r.hash_ids:
            if h in refs:
                p = len(refs) - 1 - refs[::-1].index(h)
                d = len(set(refs[p + 1 :]))
                if leading:
                    shared += 1
                    worst = d if worst is None else max(worst, d)
            else:
                leading = False
            refs.append(h)
        out.append(PrefixFacts(shared, min(shared * block, r.input_length), worst))
    return out


def test_a_small_trace_by_hand() -> None:
    got = [f for _r, f in prefix_facts([req([0, 1], 20), req([0, 2], 20), req([0, 1], 15)], 16)]
    assert got == [
        PrefixFacts(0, 0, None),
        PrefixFacts(1, 16, 1),  # 0 last used before 1: one block between
        PrefixFacts(2, 15, 2),  # 0: {2}; 1: {0, 2} since its last use; the last block partial
    ]


@settings(max_examples=60)
@given(
    st.lists(
        st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True), min_size=1, max_size=60
    )
)
def test_distances_match_brute_force(id_lists: list[list[int]]) -> None:
    # Up to 720 references, past the tree's first capacity of 1024 only sometimes: the
    # growth is exercised by the long case below.
    requests = [req(ids, len(ids) * 8) for ids in id_lists]
    assert [f for _r, f in prefix_facts(requests, 8)] == brute(requests, 8)


def test_distances_survive_the_tree_growing() -> None:
    requests = [req([i % 97, (i * 7) % 89 + 100], 16) for i in range(1500)]
    assert [f for _r, f in prefix_facts(requests, 8)] == brute(requests, 8)
