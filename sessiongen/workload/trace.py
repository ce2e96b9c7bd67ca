"""Mooncake-style JSONL traces, read one line at a time.

One request a line, as the Mooncake FAST'25 traces have them::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}

with two optional fields for multi-turn traffic:

- ``session_id`` (string or integer): the request is a turn of that session; a
  session's turns are its lines in file order;
- ``delay`` (ms): for a session's later turn, the pause between the previous turn's
  answer and this request (closed loop within a session).

A request with no earlier turn in its session (a session's first turn, or a request
without ``session_id``) needs ``timestamp`` (ms, its arrival). A later turn needs
``timestamp`` or ``delay`` (or both). Timestamps that are given never decrease down
the file. ``hash_ids`` name the prompt's blocks of ``block_tokens`` tokens (512 in
Mooncake's traces): equal ids at the same position mean an equal prefix up to and
including that block. The reader insists on exactly ``ceil(input_length /
block_tokens)`` ids, as Mooncake's traces have, rather than "at most": a trace written
at another block size then fails on its first line instead of replaying with the
wrong sharing. Unknown fields are ignored (traces from gateways carry more).

The file is streamed: :func:`read_trace` yields one small frozen :class:`TraceRequest`
at a time, so a million-line trace never holds a million objects. Only the ids of the
sessions seen so far are kept (to check that a ``delay`` follows an earlier turn).
Every problem is a one-line :class:`~sessiongen.errors.ScenarioError` naming the file,
the line and the field (``trace.jsonl: line 12: hash_ids: expected ...``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from sessiongen.errors import ScenarioError
from sessiongen.workload.jsonfile import json_lines, open_input, show

#: Mooncake's block size, tokens per hash id.
DEFAULT_BLOCK_TOKENS = 512

Window = float | tuple[float, float]


class TraceRequest(NamedTuple):
    """One line of a trace, validated, with times in replay milliseconds.

    ``timestamp_ms`` is the arrival measured from the first kept request (or from the
    window's start when a (start, end) window is given), divided by the speedup; None
    for a later turn that only has a ``delay``. ``delay_ms`` is divided by the speedup
    too.
    """

    line: int
    timestamp_ms: float | None
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None
    delay_ms: float | None


def blocks_for(input_length: int, block_tokens: int) -> int:
    """How many hash ids a prompt of ``input_length`` tokens has: ceil(length / block)."""
    return math.ceil(input_length / block_tokens)


class _Line:
    """Field checks for one line; every failure names the file, line and field."""

    def __init__(self, source: str, number: int, row: dict[str, Any]) -> None:
        self.source = source
        self.number = number
        self.row = row

    def error(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(self.source, f"line {self.number}: {key}", message)

    def integer(self, key: str, *, low: int) -> int:
        value = self.row.get(key)
        if value is None:
            raise self.error(key, "missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.error(key, f"expected an integer >= {low}, got {show(value)}")
        return value

    def millis(self, key: str) -> float | None:
        value = self.row.get(key)
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise self.error(key, f"expected milliseconds >= 0, got {show(value)}")
        return float(value)

    def session(self) -> str | None:
        value = self.row.get("session_id")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            raise self.error("session_id", f"expected a string or integer, got {show(value)}")
        return str(value)

    def hash_ids(self, input_length: int, block_tokens: int) -> tuple[int, ...]:
        value = self.row.get("hash_ids")
        if value is None:
            raise self.error("hash_ids", "missing")
        # type() rather than isinstance: a bool is not an id; one C pass over the ids
        if not isinstance(value, list) or (
            value and (set(map(type, value)) != {int} or min(value) < 0)
        ):
            raise self.error("hash_ids", f"expected a list of integers >= 0, got {show(value, 60)}")
        want = blocks_for(input_length, block_tokens)
        if len(value) != want:
            raise self.error(
                "hash_ids",
                f"expected ceil(input_length / block_tokens) = ceil({input_length} / "
                f"{block_tokens}) = {want} ids, got {len(value)} (is the trace's block size "
                f"{block_tokens}?)",
            )
        return tuple(value)


def _window(window: Window | None, source: str) -> tuple[float | None, float | None]:
    """(start, end) in trace milliseconds; start None means "the first timestamp"."""
    if window is None:
        return None, None
    if isinstance(window, tuple):
        start, end = window
        if not 0 <= start < end:
            raise ScenarioError(source, "window", f"expected 0 <= start < end, got {window}")
        return float(start), float(end)
    if not window > 0:
        raise ScenarioError(source, "window", f"expected a length in ms > 0, got {window}")
    return None, float(window)


class _Schedule:
    """Times down the file: monotone timestamps, sessions' first turns, the window.

    Keeps the ids of the sessions seen (kept or dropped), so a later turn is known as
    one and follows its session in or out of the window.
    """

    def __init__(self, start: float | None, end: float | None) -> None:
        self.origin = start
        self._start, self._end = start, end
        self._kept: set[str] = set()
        self._dropped: set[str] = set()
        self._last: tuple[float, int] | None = None

    def admit(self, ln: _Line, session: str | None, ts: float | None, delay: float | None) -> bool:
        """Whether this line's request is replayed; its time fields checked."""
        later = session is not None and (session in self._kept or session in self._dropped)
        if ts is None and not later:
            why = (
                "a session's first turn" if session is not None else "a request without session_id"
            )
            raise ln.error("timestamp", f"missing (needed for {why})")
        if delay is not None and not later:
            raise ln.error("delay", "given for a request with no earlier turn in its session")
        if ts is not None:
            if self._last is not None and ts < self._last[0]:
                raise ln.error(
                    "timestamp",
                    f"expected >= {self._last[0]:g} (line {self._last[1]}), got {ts:g}: "
                    "timestamps must not decrease down the file",
                )
            self._last = (ts, ln.number)
        if later:
            return session not in self._dropped
        assert ts is not None
        if self.origin is None:
            self.origin = ts
        end = self._end
        high = math.inf if end is None else end if self._start is not None else self.origin + end
        inside = self.origin <= ts < high
        if session is not None:
            (self._kept if inside else self._dropped).add(session)
        return inside


def _request(
    ln: _Line, block_tokens: int, schedule: _Schedule, speedup: float
) -> TraceRequest | None:
    """The line's request, or None when the window leaves it out."""
    input_length = ln.integer("input_length", low=1)
    output_length = ln.integer("output_length", low=1)
    hash_ids = ln.hash_ids(input_length, block_tokens)
    session = ln.session()
    ts = ln.millis("timestamp")
    delay = ln.millis("delay")
    if not schedule.admit(ln, session, ts, delay):
        return None
    origin = schedule.origin
    assert origin is not None
    return TraceRequest(
        line=ln.number,
        timestamp_ms=None if ts is None else (ts - origin) / speedup,
        input_length=input_length,
        output_length=output_length,
        hash_ids=hash_ids,
        session_id=session,
        delay_ms=None if delay is None else delay / speedup,
    )


def _rows(fh: IO[bytes], source: str) -> Iterator[_Line]:
    """The file's non-blank lines as JSON objects."""
    for number, row in json_lines(fh, source):
        if not isinstance(row, dict):
            raise ScenarioError(
                source, f"line {number}", f"expected a JSON object, got {show(row)}"
            )
        yield _Line(source, number, row)


def read_trace(
    path: str | Path,
    *,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    limit: int | None = None,
    window: Window | None = None,
    speedup: float = 1.0,
) -> Iterator[TraceRequest]:
    """Stream the requests of a Mooncake-style JSONL trace, validated line by line.

    ``window``: a length in ms (the first ``window`` ms from the first timestamp) or a
    (start, end) pair of trace milliseconds, end excluded; a session is kept or dropped
    whole, by the time of its first turn. ``limit``: at most this many requests (after
    the window). ``speedup``: times and delays are divided by it. Blank lines are
    skipped. The whole file is validated only as far as it is read: with a limit, lines
    after the last kept request are not looked at.
    """
    source = str(path)
    if block_tokens < 1:
        raise ScenarioError(source, "block_tokens", f"expected an integer >= 1, got {block_tokens}")
    if not speedup > 0:
        raise ScenarioError(source, "speedup", f"expected a number > 0, got {speedup}")
    if limit is not None and limit < 1:
        raise ScenarioError(source, "limit", f"expected an integer >= 1, got {limit}")
    schedule = _Schedule(*_window(window, source))
    fh = open_input(Path(path), source, "a trace file")  # open errors before the first line
    seen = kept = 0
    with fh:
        for ln in _rows(fh, source):
            seen += 1
            request = _request(ln, block_tokens, schedule, speedup)
            if request is None:
                continue
            yield request
            kept += 1
            if kept == limit:
                return
    if seen == 0:
        raise ScenarioError(source, "", "the trace is empty (no request lines)")
    if kept == 0:
        raise ScenarioError(source, "window", f"no request of the trace falls in {window}")
