"""What a trace implies before anything is replayed: its size, span and prefix reuse.

One pass over :func:`~.trace.read_trace`'s stream (``sessiongen trace-info``). The reuse
figure is the share of prompt tokens an infinite prefix cache would have served: a
request's leading blocks whose hash id appeared in an earlier request (ids are chained,
so a seen id means its whole prefix was seen). Ids seen are kept as a bitmap indexed by
id, one bit per id, since trace ids are small integers given in order (Mooncake's are);
ids beyond 2**31 go to a set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sessiongen.workload.trace import TraceRequest

_BITMAP_LIMIT = 2**31


class _Seen:
    """A set of non-negative integers, as bits while they are small."""

    def __init__(self) -> None:
        self._bits = bytearray()
        self._large: set[int] = set()

    def __contains__(self, i: int) -> bool:
        if i >= _BITMAP_LIMIT:
            return i in self._large
        byte = i >> 3
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << (i & 7)))

    def add(self, i: int) -> None:
        if i >= _BITMAP_LIMIT:
            self._large.add(i)
            return
        byte = i >> 3
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        self._bits[byte] |= 1 << (i & 7)


@dataclass(frozen=True)
class TraceSummary:
    """Counts and reuse of a trace (times in replay ms, after any speedup)."""

    requests: int
    sessions: int  # as the replay makes them: each session_id, and each line without one
    single_requests: int  # lines without a session_id: a one-turn session each
    span_ms: float
    input_tokens: int
    output_tokens: int
    longest_input: int
    longest_line: int
    distinct_blocks: int
    reusable_tokens: int

    @property
    def reusable_share(self) -> float:
        """Share of prompt tokens an infinite prefix cache would have served."""
        return self.reusable_tokens / self.input_tokens if self.input_tokens else 0.0


def summarize(requests: Iterable[TraceRequest], block_tokens: int) -> TraceSummary:
    """One pass over a trace's requests (see the module docstring for the reuse rule)."""
    seen = _Seen()
    sessions: set[str] = set()
    n = inputs = outputs = longest = longest_line = reusable = distinct = single = 0
    last_ts = 0.0
    for req in requests:
        n += 1
        inputs += req.input_length
        outputs += req.output_length
        if req.input_length > longest:
            longest, longest_line = req.input_length, req.line
        if req.timestamp_ms is not None:
            last_ts = req.timestamp_ms
        if req.session_id is not None:
            sessions.add(req.session_id)
        else:
            single += 1
        leading = True
        for k, h in enumerate(req.hash_ids):
            if h in seen:
                if leading:
                    reusable += min(block_tokens, req.input_length - k * block_tokens)
            else:
                leading = False
                distinct += 1
                seen.add(h)
    return TraceSummary(
        requests=n,
        sessions=len(sessions) + single,
        single_requests=single,
        span_ms=last_ts,
        input_tokens=inputs,
        output_tokens=outputs,
        longest_input=longest,
        longest_line=longest_line,
        distinct_blocks=distinct,
        reusable_tokens=reusable,
    )
