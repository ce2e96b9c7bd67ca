"""cl100k's token counts, one text at a time, equal tiktoken's batch encoding."""

from __future__ import annotations

from sessiongen.text.tokenize import cl100k


def test_count_batch_equals_the_batch_encoding() -> None:
    tok = cl100k()
    texts = ["", " a", "Hello, world.\n\n", " unbelievable" * 40, "数字 1234567 🙂", " x"]
    batch = tok._enc.encode_ordinary_batch(texts, num_threads=1)
    assert tok.count_batch(texts) == [len(ids) for ids in batch]
    assert tok.count_batch(texts)[1:4] != [0, 0, 0]
