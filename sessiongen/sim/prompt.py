"""Prompt token ids as the simulated replicas see them: cl100k plus a fixed chat template.

The template is ChatML written as plain text (cl100k's offline encoding has no
``<|im_start|>`` special token): each message is the ids of ``"<|im_start|>{role}\\n"``,
then the content ids, then the ids of ``"<|im_end|>\\n"``; a chat prompt ends with the
ids of ``"<|im_start|>assistant\\n"``. Each piece is encoded on its own, so a prompt's ids
(and therefore its cache blocks) are a prefix of the next turn's whenever the messages
are.

Tokenizing is memoised. A long text is cut into segments at points where cl100k's
pre-tokenizer always splits (a space followed by a letter, after a non-space), so
encoding the segments one by one gives exactly the ids of the whole text; each segment's
ids are kept in a bounded LRU keyed by a hash of the segment. A session's next turn then
re-encodes only its new text, even when a new question is appended to an old context in
the same message.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
from numpy.typing import NDArray

from sessiongen.text.tokenize import cl100k

ROLE_HEAD = "<|im_start|>{role}\n"
MESSAGE_END = "<|im_end|>\n"
SEGMENT_CHARS = 2048


def segments(text: str, target: int = SEGMENT_CHARS) -> Iterator[str]:
    """Cut ``text`` into pieces of about ``target`` chars at pre-tokenizer boundaries.

    A cut goes before a space that is followed by a letter and preceded by a non-space:
    no cl100k pre-token can span such a point (a space inside a pre-token only ever
    follows other whitespace), so BPE never merges across it. Cuts depend only on the
    text before them, so two texts with a common head are cut the same way there.
    """
    start, n = 0, len(text)
    while n - start > target:
        cut = text.find(" ", start + target)
        while cut != -1 and not (
            cut + 1 < n and text[cut + 1].isalpha() and not text[cut - 1].isspace()
        ):
            cut = text.find(" ", cut + 1)
        if cut == -1:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


class PromptTokenizer:
    """Thread-safe, memoised cl100k encoding of prompts (call it from worker threads)."""

    def __init__(self, memo_tokens: int = 8_000_000) -> None:
        self._tok = cl100k()
        self._memo: OrderedDict[tuple[int, int], NDArray[np.uint32]] = OrderedDict()
        self._memo_tokens = 0
        self._limit = memo_tokens
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._role_ids: dict[str, NDArray[np.uint32]] = {}
        self._end = self._encode_small(MESSAGE_END)
        self._assistant_head = self._encode_small(ROLE_HEAD.format(role="assistant"))

    def _encode_small(self, text: str) -> NDArray[np.uint32]:
        return np.asarray(self._tok.encode(text), dtype=np.uint32)

    def _segment_ids(self, seg: str) -> NDArray[np.uint32]:
        key = (hash(seg), len(seg))
        with self._lock:
            found = self._memo.get(key)
            if found is not None:
                self._memo.move_to_end(key)
                self.hits += 1
                return found
        ids = np.asarray(self._tok.encode(seg), dtype=np.uint32)
        ids.flags.writeable = False
        with self._lock:
            self.misses += 1
            if key not in self._memo:
                self._memo[key] = ids
                self._memo_tokens += len(ids)
            while self._memo_tokens > self._limit and self._memo:
                _, old = self._memo.popitem(last=False)
                self._memo_tokens -= len(old)
        return ids

    def encode(self, text: str) -> NDArray[np.uint32]:
        """Token ids of ``text`` (no special tokens), reusing ids of segments seen before."""
        parts = [self._segment_ids(seg) for seg in segments(text) if seg]
        if not parts:
            return np.zeros(0, dtype=np.uint32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def chat(
        self, messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True
    ) -> NDArray[np.uint32]:
        """Token ids of a chat prompt under the fixed template."""
        parts: list[NDArray[np.uint32]] = []
        for role, content in messages:
            head = self._role_ids.get(role)
            if head is None:
                head = self._encode_small(ROLE_HEAD.format(role=role))
                with self._lock:
                    self._role_ids[role] = head
            parts += [head, self.encode(content), self._end]
        if add_generation_prompt:
            parts.append(self._assistant_head)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        return self._tok.decode(list(ids))
