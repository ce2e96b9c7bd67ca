"""Prompt tokenizing in the simulator: exact despite segmenting, memoised, prefix-stable."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiongen.sim.prompt import PromptTokenizer, segments
from sessiongen.text.tokenize import cl100k

PIECES = [" the", " river", "The", ".", ",", "!", " 12345", "7", "\n", "\n\n", " ", "  ",
          "'s", " don't", " café", " 東京", "é", "-", " (x)", "\t", " a", "b", "ZZ",
          " 🙂"]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=400), st.integers(1, 40))
def test_segmented_encoding_equals_whole_text_encoding(parts: list[str], target: int) -> None:
    text = "".join(parts)
    segs = list(segments(text, target))
    assert "".join(segs) == text
    whole = cl100k().encode(text)
    assert [t for seg in segs for t in cl100k().encode(seg)] == whole


def test_segments_of_a_common_head_are_cut_alike() -> None:
    head = " The river ran past the stone." * 200
    a, b = list(segments(head + " Question one?")), list(segments(head + " Another."))
    assert len(a) > 2 and a[:-2] == b[:-2]


def test_repeated_text_is_not_re_encoded() -> None:
    tok = PromptTokenizer()
    context = " The river ran past the stone." * 2000
    first = tok.encode(context + " What is one?")
    misses = tok.misses
    second = tok.encode(context + " What is two?")
    assert tok.misses - misses <= 2  # only the segment(s) holding the new question
    assert first.tolist() == cl100k().encode(context + " What is one?")
    assert second.tolist() == cl100k().encode(context + " What is two?")


def test_memo_is_bounded() -> None:
    tok = PromptTokenizer(memo_tokens=1000)
    for i in range(50):
        tok.encode(f"Sentence number {i}. " * 100)
    assert tok._memo_tokens <= 1000


def test_chat_template_and_turn_prefix() -> None:
    tok = PromptTokenizer()
    turn1 = [("system", "Be brief."), ("user", "Hello there.")]
    turn2 = [*turn1, ("assistant", "Hi."), ("user", "And now?")]
    ids1 = tok.chat(turn1, add_generation_prompt=False)
    ids2 = tok.chat(turn2)
    assert tok.decode(ids1.tolist()) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there.<|im_end|>\n"
    )
    assert np.array_equal(ids2[: len(ids1)], ids1)  # a turn's prompt heads the next one's
    assert tok.decode(ids2.tolist()).endswith("<|im_end|>\n<|im_start|>assistant\n")
