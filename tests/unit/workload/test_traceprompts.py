"""Trace prompts: shared hash ids are shared tokens, exactly, and nothing more."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiongen.errors import ScenarioError
from sessiongen.text.tokenize import TiktokenTokenizer, cl100k
from sessiongen.workload.textgen import TextGenerator, default_generator
from sessiongen.workload.trace import TraceRequest
from sessiongen.workload.traceprompts import TracePrompts

ENC = cl100k()


def common(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def request(hash_ids: list[int], input_length: int) -> TraceRequest:
    return TraceRequest(0, 0.0, input_length, 1, tuple(hash_ids), None, None)


@st.composite
def prefix_trees(draw: st.DrawFn) -> tuple[int, list[TraceRequest]]:
    """Requests that branch off earlier ones at random blocks, as a trace's do."""
    block = draw(st.sampled_from([4, 16, 64, 512]))
    fresh = itertools.count(draw(st.integers(0, 2000)))
    requests: list[TraceRequest] = []
    for _ in range(draw(st.integers(2, 7))):
        ids: list[int] = []
        if requests:
            parent = draw(st.sampled_from(requests)).hash_ids
            ids = list(parent[: draw(st.integers(0, len(parent)))])
        ids += [next(fresh) for _ in range(draw(st.integers(0 if ids else 1, 4)))]
        n = draw(st.integers((len(ids) - 1) * block + 1, len(ids) * block))
        requests.append(request(ids, n))
    return block, requests


@settings(max_examples=40)
@given(tree=prefix_trees(), seed=st.integers(0, 3), salt=st.sampled_from(["a", "run-2"]))
def test_shared_leading_ids_are_exactly_the_shared_leading_tokens(
    tree: tuple[int, list[TraceRequest]], seed: int, salt: str
) -> None:
    block, requests = tree
    prompts = TracePrompts(default_generator(), seed=seed, salt=salt, block_tokens=block)
    tokens = [ENC.encode(prompts.text(r)) for r in requests]
    for r, ids in zip(requests, tokens, strict=True):
        assert len(ids) == r.input_length
    for (a, ta), (b, tb) in itertools.combinations(zip(requests, tokens, strict=True), 2):
        shared = common(list(a.hash_ids), list(b.hash_ids))
        if shared < min(len(a.hash_ids), len(b.hash_ids)):
            want = shared * block  # they differ from block shared + 1 on
        else:  # one's ids lead the other's: up to the shorter's (maybe partial) end
            want = min(a.input_length, b.input_length)
        assert common(ta, tb) == want, (a.hash_ids, b.hash_ids)


def test_every_unit_is_one_token_wherever_a_block_starts() -> None:
    # 3000 blocks of 4 tokens: 3000 slices of the prose stream, each after a head word.
    gen = default_generator()
    prompts = TracePrompts(gen, seed=5, salt="s", block_tokens=4)
    units = prompts.unit_ids(list(range(3000)), 12_000)
    unit_tokens = [ENC.encode(u)[0] for u in gen.units[units].tolist()]
    assert ENC.encode(prompts.text(request(list(range(3000)), 12_000))) == unit_tokens


def test_ids_congruent_modulo_the_word_pool_differ_by_their_second_token() -> None:
    prompts = TracePrompts(default_generator(), seed=0, salt="s", block_tokens=32)
    n = len(default_generator().one_token_words)
    a = ENC.encode(prompts.text(request([7, 5], 64)))
    b = ENC.encode(prompts.text(request([7, 5 + n], 64)))
    assert common(a, b) == 32 + 1


def test_salt_moves_every_head_and_nothing_else() -> None:
    gen = default_generator()
    one = TracePrompts(gen, seed=3, salt="one", block_tokens=64)
    two = TracePrompts(gen, seed=3, salt="two", block_tokens=64)
    for h in (0, 1, 4097):
        a, b = one.block(h), two.block(h)
        assert a[0] != b[0]
        assert a[3:].tolist() == b[3:].tolist()
    assert one.block(0)[3:].tolist() != one.block(1)[3:].tolist()  # bodies vary by id
    assert (
        one.block(0)[3:].tolist()
        != TracePrompts(gen, seed=4, salt="one", block_tokens=64).block(0)[3:].tolist()
    )


def test_blocks_are_rebuilt_identically_after_eviction() -> None:
    gen = default_generator()
    small = TracePrompts(gen, seed=1, salt="x", block_tokens=16, cache_blocks=1)
    big = TracePrompts(gen, seed=1, salt="x", block_tokens=16)
    r = request([5, 6, 5, 9], 60)
    first = small.text(r)
    assert len(small._blocks) == 1
    assert first == small.text(r) == big.text(r)


def test_prompts_need_a_tokenizer_that_adds_up_over_words() -> None:
    class Merging(TiktokenTokenizer):
        @property
        def pretokenizes_on_spaces(self) -> bool:
            return False

    with pytest.raises(ScenarioError, match="splits on spaces before BPE"):
        TracePrompts(TextGenerator(Merging()), seed=0, salt="s")


def test_ids_that_cannot_make_the_length_are_refused() -> None:
    prompts = TracePrompts(default_generator(), seed=0, salt="s", block_tokens=16)
    with pytest.raises(ValueError, match="2 hash ids cannot make 40 tokens"):
        prompts.text(request([1, 2], 40))
