"""Token-exact prompts for trace requests, built block by block from their hash ids.

A trace says which prompts share which prefix blocks (:mod:`.trace`); this module makes
prompts with exactly that sharing. Block ``h`` is always the same ``block_tokens``
tokens, so two requests whose first k hash ids agree share exactly their first
``k * block_tokens`` tokens, and a request's last block is cut to what its
``input_length`` leaves, so every prompt is exactly ``input_length`` tokens.

How exactness is kept without encoding whole prompts: every unit a block is made of
(a word with its leading space, ``,``, ``.``, ``.\\n\\n``, a paragraph start) is one
token, and for a tokenizer that splits on spaces and punctuation before BPE (cl100k
does: ``pretokenizes_on_spaces``) a text of such units tokenizes unit by unit. So a
prompt's tokens are its units, any prefix of a block is a prefix of its tokens, and
the partial last block is the full block's first tokens. A block is its head (below)
and then a slice, chosen by the scenario seed and the hash id, of one long stream of
prose from the workload's :class:`~.textgen.TextGenerator`, made once per run with its
few multi-token units (two-piece compounds, some capitalised words) swapped for
one-token words and paragraph starts given their leading space, so that no slice can
merge with the head before it. Other tokenizers are refused: their counts do not add
up over units, and fitting each prompt by re-encoding could not keep blocks equal
across prompts.

Each block starts with three head words chosen from the block's hash id, offset by the
run salt: ``pool[(h + a) % N]``, ``pool[(h // N + b) % N]``, ``pool[(h // N² + c) % N]``
over the N one-token words (3000 for cl100k). Within a run the head is injective for
ids below N³, so blocks with different ids differ by their third token at the latest,
and at their first token unless the ids are congruent modulo N. Across runs the salt
moves every head, so the first block (and with it every prefix) differs between runs,
as the session markers make them differ today (:func:`.requests.marker`); the rest of
a block depends only on the scenario seed and the hash id, so runs with different
salts stay comparable.

Blocks (unit ids and text) are kept in a bounded LRU (``cache_blocks``, 4096 by default:
about 7 KiB a block at 512 tokens, 28 MiB), rebuilt identically when evicted; a block
costs a slice and a join, so building a prompt is dominated by joining its text.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from sessiongen.errors import ScenarioError
from sessiongen.workload.textgen import TextGenerator
from sessiongen.workload.trace import DEFAULT_BLOCK_TOKENS, TraceRequest, blocks_for

_HEAD = 3
#: One-token units of prose that blocks are slices of (2 MiB of ids).
_PROSE_UNITS = 2**18
#: Mixed into every block's seed, so trace blocks never repeat a session's text.
_STREAM = 0x7472616365  # "trace"

UnitIds = NDArray[np.int64]


def check_tokenizer(generator: TextGenerator) -> None:
    """A trace's texts are exact to the token only with a tokenizer that splits on spaces
    before BPE: a one-line error otherwise (checked when the trace is loaded, before any
    text is made)."""
    if not generator.exact_by_units:
        raise ScenarioError(
            "model.tokenizer",
            "",
            f"trace prompts need a tokenizer that splits on spaces before BPE (cl100k); "
            f"{generator.tokenizer.identity} does not",
        )


class TracePrompts:
    """The prompts of one run's trace requests: ``text(request)`` is exact to the token."""

    def __init__(
        self,
        generator: TextGenerator,
        *,
        seed: int,
        salt: str,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        cache_blocks: int = 4096,
    ) -> None:
        check_tokenizer(generator)
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.generator = generator
        self.seed = seed
        self.block_tokens = block_tokens
        self._cache_blocks = max(1, cache_blocks)
        self._blocks: OrderedDict[int, tuple[UnitIds, str]] = OrderedDict()
        self._pool = np.asarray(generator.one_token_words, dtype=np.int64)
        digest = hashlib.blake2b(f"trace\x1f{salt}".encode(), digest_size=12).digest()
        n = len(self._pool)
        self._offsets = [int.from_bytes(digest[4 * i : 4 * i + 4], "little") % n for i in range(3)]
        self._prose = one_token_prose(generator, seed, max(_PROSE_UNITS, 4 * block_tokens))

    def head(self, hash_id: int) -> UnitIds:
        """The block's first three units: its hash id in base N, shifted by the salt."""
        n = len(self._pool)
        digits = [(hash_id // n**i + self._offsets[i]) % n for i in range(_HEAD)]
        return self._pool[digits]

    def block(self, hash_id: int) -> UnitIds:
        """The ``block_tokens`` unit ids (one token each) of block ``hash_id``."""
        return self._block(hash_id)[0]

    def _block(self, hash_id: int) -> tuple[UnitIds, str]:
        cached = self._blocks.get(hash_id)
        if cached is not None:
            self._blocks.move_to_end(hash_id)
            return cached
        n = self.block_tokens
        head = self.head(hash_id)[:n]
        size = n - len(head)
        key = hashlib.blake2b(f"{self.seed}\x1f{hash_id}".encode(), digest_size=8).digest()
        at = int.from_bytes(key, "little") % (len(self._prose) - size + 1)
        ids = np.concatenate([head, self._prose[at : at + size]])
        ids.setflags(write=False)
        entry = (ids, self.generator.text_of(ids))
        self._blocks[hash_id] = entry
        if len(self._blocks) > self._cache_blocks:
            self._blocks.popitem(last=False)
        return entry

    def _check(self, hash_ids: Sequence[int], input_length: int) -> int:
        """The length of the last block; a ValueError if the ids cannot make the length."""
        if len(hash_ids) != blocks_for(input_length, self.block_tokens):
            raise ValueError(
                f"{len(hash_ids)} hash ids cannot make {input_length} tokens "
                f"at {self.block_tokens} a block"
            )
        return input_length - self.block_tokens * (len(hash_ids) - 1)

    def unit_ids(self, hash_ids: Sequence[int], input_length: int) -> UnitIds:
        """The prompt's units, one token each: its blocks in order, the last one cut."""
        tail = self._check(hash_ids, input_length)
        parts = [self.block(h) for h in hash_ids]
        parts[-1] = parts[-1][:tail]
        return np.concatenate(parts)

    def text(self, request: TraceRequest) -> str:
        """The prompt of ``request``: exactly ``input_length`` tokens."""
        ids = request.hash_ids
        tail = self._check(ids, request.input_length)
        texts = [self._block(h)[1] for h in ids[:-1]]
        last, last_text = self._block(ids[-1])
        texts.append(
            last_text if tail == self.block_tokens else self.generator.text_of(last[:tail])
        )
        return "".join(texts)


@functools.lru_cache(maxsize=4)
def one_token_prose(generator: TextGenerator, seed: int, size: int) -> UnitIds:
    """A long stream of one-token units that any slice of may follow a head word.

    Paragraph starts (no leading space) become sentence starts, since a slice may begin
    with one right after a head word and would merge with it; any unit that is not one
    token is swapped for a one-token word. Kept for the few last (generator, seed)
    pairs: it takes a few hundred ms to make and every run's blocks slice it.
    """
    gen = generator
    pool = gen.one_token_words
    rng = np.random.default_rng([seed, _STREAM])
    ids = gen.unit_ids(rng, size).astype(np.int64)
    para = (ids >= 2 * gen.n_lower) & (ids < 3 * gen.n_lower)
    ids[para] -= gen.n_lower
    multi = gen.counts[ids] != 1
    ids[multi] = rng.choice(pool, size=int(multi.sum()))
    if len(ids) < size:
        ids = np.concatenate([ids, rng.choice(pool, size=size - len(ids))])
    ids.setflags(write=False)
    return ids
