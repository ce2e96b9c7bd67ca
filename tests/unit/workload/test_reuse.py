"""Prefix-sharing facts: shared leading blocks and LRU stack distances, against brute force,
from the Python loop and the compiled walk alike; and the two against each other."""

from __future__ import annotations

import os
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiongen.errors import MissingDependencyError, UserError
from sessiongen.infra.extensions import ENV
from sessiongen.workload import reuse
from sessiongen.workload.reuse import PrefixFacts, prefix_facts
from sessiongen.workload.trace import TraceRequest

Engine = Literal["python", "compiled"]
ENGINES: tuple[Engine, ...] = ("python", "compiled")


def need(engine: Engine) -> None:
    """A compiled case fails where the kernel is not built or stale (as the engine's tests
    do: a broken build must not pass unnoticed), unless ``SESSIONGEN_ENGINE=python`` says
    the Python path is the one meant."""
    module, why = reuse._load()
    if engine == "compiled" and module is None:
        if os.environ.get(ENV) == "python":
            pytest.skip(f"{ENV}=python: the compiled reuse kernel was not chosen")
        pytest.fail(f"the compiled reuse kernel is {why}")


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


def facts(requests: list[TraceRequest], block: int, engine: Engine) -> list[PrefixFacts]:
    need(engine)
    return [f for _r, f in prefix_facts(requests, block, engine=engine)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_small_trace_by_hand(engine: Engine) -> None:
    got = facts([req([0, 1], 20), req([0, 2], 20), req([0, 1], 15)], 16, engine)
    assert got == [
        PrefixFacts(0, 0, None),
        PrefixFacts(1, 16, 1),  # 0 last used before 1: one block between
        PrefixFacts(2, 15, 2),  # 0: {2}; 1: {0, 2} since its last use; the last block partial
    ]


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=60)
@given(
    st.lists(
        st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True), min_size=1, max_size=60
    )
)
def test_distances_match_brute_force(engine: Engine, id_lists: list[list[int]]) -> None:
    # Up to 720 references, past the tree's first capacity of 1024 only sometimes: the
    # growth is exercised by the long case below.
    requests = [req(ids, len(ids) * 8) for ids in id_lists]
    assert facts(requests, 8, engine) == brute(requests, 8)


@pytest.mark.parametrize("engine", ENGINES)
def test_distances_survive_the_tree_growing(engine: Engine) -> None:
    requests = [req([i % 97, (i * 7) % 89 + 100], 16) for i in range(1500)]
    assert facts(requests, 8, engine) == brute(requests, 8)


def random_trace(seed: int, n: int, *, scale: int, block: int) -> list[TraceRequest]:
    """Chained prompts: most extend a cut of an earlier prompt with fresh blocks; some are
    empty, some all fresh, some repeat a block of their own. Ids are ``scale`` apart."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    fresh = 0
    out = []
    for _ in range(n):
        roll = rng.random()
        ids: list[int] = []
        if roll >= 0.05:
            if prompts and roll < 0.75:
                base = prompts[int(rng.integers(max(0, len(prompts) - 300), len(prompts)))]
                ids = base[: int(rng.integers(0, len(base) + 1))]
            added = int(rng.integers(0 if ids else 1, 8))
            ids = ids + list(range(fresh, fresh + added))
            fresh += added
            if rng.random() < 0.1:
                ids.insert(int(rng.integers(0, len(ids) + 1)), ids[int(rng.integers(0, len(ids)))])
        prompts.append(ids)
        length = max(0, len(ids) * block - int(rng.integers(0, block)))
        out.append(req([i * scale for i in ids], length))
    return out


@pytest.mark.parametrize(
    "scale",
    [
        1,  # small ids: the walk indexes them as they are
        10**12,  # spread ids: densified first
        2**63 + 1,  # past int64, within 64 bits: the Python loop, whichever is asked
        -(10**9),  # negative ids (the file reader refuses them; the walk densifies them)
        2**70,  # past 64 bits: the Python loop, whichever is asked
    ],
)
def test_the_compiled_walk_gives_the_python_facts(scale: int) -> None:
    need("compiled")
    requests = random_trace(21, 4000, scale=scale, block=16)
    python = [f for _r, f in prefix_facts(requests, 16, engine="python")]
    compiled = list(prefix_facts(iter(requests), 16, engine="compiled"))
    assert [r for r, _f in compiled] == requests
    assert [f for _r, f in compiled] == python
    # the trace shares, at many distances, and has the odd cases
    assert sum(f.shared_blocks > 0 for f in python) > 1000
    assert len({f.reuse_distance for f in python}) > 100
    assert sum(len(set(r.hash_ids)) < len(r.hash_ids) for r in requests) > 100
    assert sum(not r.hash_ids for r in requests) > 100


def test_the_environment_forces_python(monkeypatch: pytest.MonkeyPatch) -> None:
    need("compiled")
    monkeypatch.delenv(ENV, raising=False)
    assert reuse.kernel() is not None
    monkeypatch.setenv(ENV, "python")
    assert reuse.kernel() is None
    assert reuse.kernel("compiled") is not None
    monkeypatch.setenv(ENV, "fast")  # one rule for every compiled module: a typo is an error
    with pytest.raises(UserError, match="SESSIONGEN_ENGINE=fast"):
        reuse.kernel()


def test_a_kernel_asked_for_and_not_built_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reuse, "_load", lambda: (None, "not built (no module)"))
    with pytest.raises(MissingDependencyError, match="reuse kernel is not built"):
        reuse.kernel("compiled")
    monkeypatch.setenv(ENV, "compiled")
    with pytest.raises(MissingDependencyError):
        reuse.kernel()
    monkeypatch.setenv(ENV, "auto")
    assert reuse.kernel() is None
