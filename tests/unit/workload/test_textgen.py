"""workload.textgen: the prose units, laid out with arrays, are those of the definition
written as a loop, draw for draw."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sessiongen.workload.textgen import TextGenerator, default_generator


def _by_loop(g: TextGenerator, rng: np.random.Generator, n_tokens: int) -> NDArray[np.int64]:
    """unit_ids as first written: sentence by sentence, word by word."""
    if n_tokens <= 0:
        return np.zeros(0, dtype=np.int64)
    n_words = int(n_tokens / g.mean_count * 1.15) + 32
    words = rng.choice(g.n_lower, size=n_words, p=g.p).tolist()
    lengths = rng.integers(6, 22, size=n_words // 6 + 2)
    para_end = rng.random(len(lengths)) < 0.2
    commas = rng.random(n_words) < 0.07
    ids: list[int] = []
    w, start_kind = 0, 1
    for length, para in zip(lengths.tolist(), para_end.tolist(), strict=True):
        if w + length > n_words:
            break
        ids.append(words[w] + start_kind * g.n_lower)
        for j in range(w + 1, w + length):
            if commas[j] and j < w + length - 1:
                ids.append(g.COMMA)
            ids.append(words[j])
        ids.append(g.PARA if para else g.PERIOD)
        start_kind = 2 if para else 1
        w += length
    arr = np.asarray(ids, dtype=np.int64)
    csum = np.cumsum(g.counts[arr])
    keep = int(np.searchsorted(csum, n_tokens, side="right"))
    arr = arr[:keep]
    short = n_tokens - (int(csum[keep - 1]) if keep else 0)
    if short:
        arr = np.concatenate([arr, rng.choice(g.one_token_words, size=short)])
    return arr


def test_unit_ids_are_the_loops_units_for_every_seed_and_length() -> None:
    g = default_generator()
    for seed in range(400):  # fixed seeds: the same texts in every run
        n = [0, 1, 5, 30, 300, 512, 3136, 20000][seed % 8]
        want = _by_loop(g, np.random.default_rng(seed), n)
        got = g.unit_ids(np.random.default_rng(seed), n)
        assert got.dtype == np.int64 and np.array_equal(got, want), (seed, n)
        assert int(g.counts[got].sum()) == n
