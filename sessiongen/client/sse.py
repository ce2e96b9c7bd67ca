"""Server-sent events on bytes, applied to a :class:`~sessiongen.client.result.Result`.

:class:`SSEParser` splits events at blank lines as bytes arrive and hands each ``data``
payload to :func:`apply_event`, which reads one OpenAI-style chunk: the first
non-empty ``content`` (chat) or ``text`` (completions) delta ends TTFT, reasoning
deltas are counted apart, logprobs are collected, and the chunk that carries ``usage``
is kept whole (servers put their own account of the request there). Nothing on this
path looks for anything else: checks that only some callers need (calibration stamps,
the simulator's facts) read the kept usage chunk afterwards.
"""

from __future__ import annotations

from typing import Any

import orjson

from sessiongen.client.result import Result


class StreamFault(Exception):
    """The stream broke its format (malformed event, an error object mid-stream)."""


def apply_event(data: bytes, now: int, res: Result) -> bool:
    """Apply one SSE ``data`` payload read at ``now``; True when it was ``[DONE]``."""
    if data == b"[DONE]":
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise StreamFault(f"malformed SSE data: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise StreamFault(f"malformed SSE data: {data[:80]!r}")
    if "error" in obj:
        raise StreamFault(f"server error in stream: {str(obj['error'])[:160]}")
    usage = obj.get("usage")
    if usage:
        take_usage(usage, res)
        res.usage_chunk = obj
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        if delta is not None:
            content = delta.get("content")
            if delta.get("reasoning_content") or delta.get("reasoning"):
                res.reasoning_chunks += 1
        else:
            content = choice.get("text")
        if content:
            if res.ttft_s is None:
                res.ttft_s = (now - res.send_ns) / 1e9
            res.chunk_ns.append(now)
            res.pieces.append(content)
        logprobs = choice.get("logprobs")
        if logprobs:
            _take_logprobs(logprobs, res)
    return False


def take_usage(usage: dict[str, Any], res: Result) -> None:
    """Prompt, completion and cached token counts of an OpenAI ``usage`` object."""
    res.prompt_tokens = usage.get("prompt_tokens")
    res.completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    res.cached_tokens = details.get("cached_tokens")


def _take_logprobs(logprobs: Any, res: Result) -> None:
    if isinstance(logprobs.get("content"), list):  # chat
        for item in logprobs["content"]:
            if res.first_logprob is None:
                res.first_logprob = item.get("logprob")
            res.logprob_tokens.append(str(item.get("token")))
    elif isinstance(logprobs.get("token_logprobs"), list):  # completions
        for tok, lp in zip(logprobs.get("tokens") or [], logprobs["token_logprobs"], strict=False):
            if res.first_logprob is None:
                res.first_logprob = lp
            res.logprob_tokens.append(str(tok))


class SSEParser:
    """Incremental SSE parser on bytes: events are split at blank lines, in place.

    The common event is one ``data: {...}`` line; it is recognised with two C-level
    searches and handed to orjson without building a list of lines. Buffered bytes
    are only the tail of an incomplete event, so the work per read is linear in
    what arrived (no re-scanning, no quadratic re-slicing of a growing buffer).
    """

    __slots__ = ("_cr", "_tail", "done", "res")

    def __init__(self, res: Result) -> None:
        self.res = res
        self.done = False
        self._tail = b""
        self._cr = False  # a chunk ended in "\r": it may pair with a leading "\n"

    def feed(self, data: bytes, now: int) -> None:
        """Parse what arrived; raises :class:`StreamFault` on a malformed event."""
        if self.done:
            return
        if b"\r" in data or self._cr:  # CRLF or CR line ends: normalise (rare path)
            if self._cr and data.startswith(b"\n"):
                data = data[1:]
            self._cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._tail + data if self._tail else data
        pos = 0
        while True:
            end = buf.find(b"\n\n", pos)
            if end < 0:
                break
            if buf.startswith(b"data: ", pos) and buf.find(b"\n", pos, end) < 0:
                payload: bytes | None = buf[pos + 6 : end]
            else:
                payload = _event_data(buf[pos:end])
            pos = end + 2
            if payload is not None and apply_event(payload, now, self.res):
                self.done = True
                self._tail = b""
                return
        self._tail = buf[pos:] if pos else buf


def _event_data(event: bytes) -> bytes | None:
    """The data of a general SSE event (several data lines, comments, other fields)."""
    lines = [
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(lines) if lines else None
