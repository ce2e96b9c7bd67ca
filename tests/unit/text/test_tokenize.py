"""cl100k's token counts, one text at a time, equal tiktoken's batch encoding."""

from __future__ import annotations

from sessiongen.text.tokenize import cl100k


def test_count_batch_equals_the_batch_encoding() -> None:
    tok = cl100k()
    texts = ["", " a", "Hello, world.\n\n", " unbelievable" * 40, "数字 1234567 🙂", " x"]
    batch = tok._enc.encode_ordinary_batch(texts, num_threads=1)
    assert tok.count_batch(texts) == [len(ids) for ids in batch]
    assert tok.count_batch(texts)[1:4] != [0, 0, 0]


def test_a_pieces_text_is_what_decoding_it_alone_gives() -> None:
    enc = cl100k()
    # every 7th id of the vocabulary: words, spaces, punctuation and partial UTF-8 bytes
    ids = range(0, 100_000, 7)
    assert [enc.piece(i) for i in ids] == [enc.decode([i]) for i in ids]
    assert any("\ufffd" in enc.piece(i) for i in ids)  # some are partial characters
