"""Deterministic prose of an exact token length.

Text is built from *units* whose token counts are known: lowercase words with a leading
space (`` house``), capitalised sentence starts (`` The``), paragraph starts after a
break (``The``), and the punctuation units ``,`` ``.`` and ``.\\n\\n``. Words are drawn
from a Zipf-like distribution over single-token alphabetic pieces of cl100k's
vocabulary (plus two-piece compounds, so multi-token words occur too), in sentences of
6 to 21 words with occasional commas and paragraph breaks. Many pieces are fragments of
words ("weap", "scient"): the text has the shape and token statistics of prose, not its
sense.

For tokenizers that split on spaces and punctuation before BPE (cl100k does), a text
of such units tokenizes unit by unit, so its length is the sum of the units' counts
and no whole-text encode is needed. Other tokenizers are checked with a full encode
and the tail is corrected until the count is exact.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from sessiongen.text import tokenize
from sessiongen.text.tokenize import Tokenizer, cl100k

#: Bump when the generated text changes for the same seed; recorded in manifests.
GENERATOR_VERSION = "prose-v1"

_N_WORDS = 3000
_N_COMPOUNDS = 1000


_SHORT_WORDS = frozenset(
    "the and for you are not was but all can has his one who any new had our out its her "
    "may way use two how man day get see now old did let put say she too end why off own "
    "set run low few big yet ask per top lot".split()
)
_BLOCKED = frozenset({"ass", "sex", "porn", "fuck", "shit", "dick", "nude", "rape", "kill"})


@functools.cache
def _word_list() -> tuple[str, ...]:
    """Common lowercase English words that are single cl100k tokens, most frequent first.

    BPE merge order (the token id) roughly follows frequency in cl100k's training text,
    so the first ids are the common words; the Zipf-like draw below relies on that order.
    """
    enc = cl100k()
    words: list[str] = []
    pattern = re.compile(r"^ [a-z]{4,12}$")
    for token_id in range(100_000):
        piece = enc.piece(token_id)
        word = piece[1:]
        if word in _SHORT_WORDS or (
            pattern.match(piece) and re.search("[aeiouy]", word) and word not in _BLOCKED
        ):
            words.append(word)
            if len(words) == _N_WORDS:
                break
    return tuple(words)


class TextGenerator:
    """Makes prose of exactly N tokens of a given tokenizer, deterministically from a seed."""

    def __init__(self, tokenizer: Tokenizer, unit_counter: Tokenizer | None = None) -> None:
        """``unit_counter`` estimates unit lengths when asking ``tokenizer`` per unit is
        too slow (a server's /tokenize); whole texts are then fitted with ``tokenizer``."""
        self.tokenizer = tokenizer
        words = _word_list()
        rng = np.random.default_rng(20261130)
        pairs = rng.integers(0, len(words), size=(_N_COMPOUNDS, 2))
        compounds = [words[a] + words[b] for a, b in pairs if len(words[a] + words[b]) <= 16]
        lower = list(words) + compounds
        self.n_lower = len(lower)
        units = (
            [" " + w for w in lower]  # lower: [0, n)
            + [" " + w.capitalize() for w in lower]  # sentence start: [n, 2n)
            + [w.capitalize() for w in lower]  # paragraph start: [2n, 3n)
            + [",", ".", ".\n\n"]
        )
        self.units = np.array(units, dtype=object)
        self.counts = np.array((unit_counter or tokenizer).count_batch(units), dtype=np.int64)
        self.COMMA, self.PERIOD, self.PARA = (
            3 * self.n_lower,
            3 * self.n_lower + 1,
            3 * self.n_lower + 2,
        )
        ranks = np.arange(self.n_lower, dtype=np.float64)
        weights = 1.0 / (ranks + 8.0)
        self.p = weights / weights.sum()
        ones = np.flatnonzero(self.counts[: self.n_lower] == 1)
        if len(ones) == 0:
            raise ValueError(f"tokenizer {tokenizer.identity}: no single-token words to fill with")
        self.one_token_words = ones
        self.mean_count = float(np.dot(self.p, self.counts[: self.n_lower]))
        self.exact_by_units = tokenizer.pretokenizes_on_spaces

    @property
    def identity(self) -> str:
        """Generator version plus a hash of its unit table (recorded in manifests)."""
        digest = hashlib.sha256("\x00".join(self.units.tolist()).encode()).hexdigest()[:12]
        return f"{GENERATOR_VERSION}:{digest}"

    def unit_ids(self, rng: np.random.Generator, n_tokens: int) -> NDArray[np.int64]:
        """Unit ids of prose starting with a sentence, summing to exactly ``n_tokens``."""
        if n_tokens <= 0:
            return np.zeros(0, dtype=np.int64)
        n_words = int(n_tokens / self.mean_count * 1.15) + 32
        words = rng.choice(self.n_lower, size=n_words, p=self.p)
        lengths = rng.integers(6, 22, size=n_words // 6 + 2)
        para_end = rng.random(len(lengths)) < 0.2
        commas = rng.random(n_words) < 0.07
        # Sentences of the drawn lengths while they fit in the drawn words; a sentence's
        # first word is capitalised (after a paragraph's end, without the space), a comma
        # may precede any word but its first and last, and it ends with a period or a
        # paragraph break. Laid out with arrays: a word's units are an optional comma,
        # the word, and after a sentence's last word its end.
        ends = np.cumsum(lengths)
        kept = int(np.searchsorted(ends, n_words, side="right"))  # the sentences that fit
        used = int(ends[kept - 1]) if kept else 0
        sentence = np.repeat(np.arange(kept), lengths[:kept])  # each used word's sentence
        at = np.arange(used)
        first = at == (ends[:kept] - lengths[:kept])[sentence]
        last = at == ends[:kept][sentence] - 1
        kind = np.ones(kept, dtype=np.int64)  # 1: a sentence start, 2: a paragraph start
        kind[1:] += para_end[: kept - 1]
        value = words[:used] + np.where(first, kind[sentence] * self.n_lower, 0)
        comma = commas[:used] & ~first & ~last
        count = 1 + comma.astype(np.int64) + last
        where = np.cumsum(count) - count  # each word's first unit
        arr: NDArray[np.int64] = np.empty(int(count.sum()), dtype=np.int64)
        arr[where[comma]] = self.COMMA
        arr[where + comma] = value
        arr[(where + comma + 1)[last]] = np.where(para_end[:kept], self.PARA, self.PERIOD)
        csum = np.cumsum(self.counts[arr])
        keep = int(np.searchsorted(csum, n_tokens, side="right"))
        arr = arr[:keep]
        short = n_tokens - (int(csum[keep - 1]) if keep else 0)
        if short:
            fill = rng.choice(self.one_token_words, size=short)
            arr = np.concatenate([arr, fill])
        return arr

    def text_of(self, ids: NDArray[np.int64]) -> str:
        """Join units into text."""
        return "".join(self.units[ids].tolist())

    def prose(self, rng: np.random.Generator, n_tokens: int) -> str:
        """Prose of exactly ``n_tokens`` tokens (checked by full encode when needed)."""
        text = self.text_of(self.unit_ids(rng, n_tokens))
        if self.exact_by_units:
            return text
        return self.fit(text, n_tokens, rng)

    def fit(self, text: str, n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
        """Trim or extend ``text`` until ``prefix + text`` is exactly ``n_tokens`` long.

        Used for tokenizers whose counts are not additive over units: each step
        re-encodes and adds or drops single-token words at the end.
        """
        for _ in range(64):
            have = self.tokenizer.count_batch([prefix + text])[0]
            if have == n_tokens:
                return text
            if have < n_tokens:
                fill = rng.choice(self.one_token_words, size=n_tokens - have)
                text += self.text_of(fill)
            else:
                cut = text.rstrip().rfind(" ")
                text = text[:cut] if cut > 0 else ""
        raise ValueError(f"tokenizer {self.tokenizer.identity}: could not fit {n_tokens} tokens")

    def count(self, text: str) -> int:
        """Token count of any text."""
        return self.tokenizer.count_batch([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Token counts of several texts."""
        return self.tokenizer.count_batch(list(texts))


@functools.cache
def default_generator() -> TextGenerator:
    """The cl100k text generator, built once per process."""
    return TextGenerator(cl100k())


def generator_for(spec: str, *, server_url: str | None = None, model: str = "") -> TextGenerator:
    """The text generator for a scenario's ``model.tokenizer``.

    ``cl100k`` is shared per process. A ``tokenizer.json`` counts its own units. A
    server's ``/tokenize`` would need one request per unit (thousands), so cl100k
    estimates unit lengths and every whole text is fitted with the server's counts.
    """
    if spec == "cl100k":
        return default_generator()
    tok = tokenize.get(spec, server_url=server_url, model=model)
    if spec == "server":
        return TextGenerator(tok, unit_counter=cl100k())
    return TextGenerator(tok)
