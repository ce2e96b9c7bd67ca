"""What one request measured, as the client saw it (:class:`Result`).

Durations are wall seconds from ``send_ns``, the moment the connection is in hand and
the request is about to be written (see :mod:`sessiongen.client.driver` for each
definition); None when the moment was never reached.
"""

from __future__ import annotations

import hashlib
import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """What one request measured. Durations are wall seconds; None when never reached."""

    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    send_ns: int = 0
    ttfb_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_ns: list[int] = field(default_factory=list)
    reasoning_chunks: int = 0
    pieces: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    first_logprob: float | None = None
    logprob_tokens: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # response headers, names lowercased
    # The final chunk that carried ``usage``, kept whole: servers put their own account
    # of the request there (the simulator's "sim" object, the reference server's stamps).
    usage_chunk: dict[str, Any] | None = None
    connect_s: float | None = None  # connection setup before send_ns (None: reused)
    reads: int = 0  # socket reads that delivered response bytes

    @property
    def text(self) -> str:
        """The output text (joined once: appending to a str per chunk is quadratic)."""
        return "".join(self.pieces)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def itl(self) -> list[float]:
        """Gaps between consecutive content deltas, seconds."""
        ns = self.chunk_ns
        return [(b - a) / 1e9 for a, b in itertools.pairwise(ns)]

    def itl_p50_s(self) -> float | None:
        """Median inter-token gap, seconds (None with fewer than two content deltas)."""
        itl = self.itl()
        return statistics.median(itl) if itl else None

    def itl_max_s(self) -> float | None:
        """Largest inter-token gap, seconds."""
        itl = self.itl()
        return max(itl) if itl else None

    def output_digest(self) -> str | None:
        """Digest of the output tokens (logprob tokens when given, else the text)."""
        if not self.ok:
            return None
        basis = "\x1f".join(self.logprob_tokens) if self.logprob_tokens else self.text
        return hashlib.blake2b(basis.encode(), digest_size=8).hexdigest()

    def server_facts(self, key: str) -> dict[str, Any]:
        """The object a server put under ``key`` in its final usage chunk, or empty."""
        facts = (self.usage_chunk or {}).get(key)
        return facts if isinstance(facts, dict) else {}
