"""The async streaming driver: one request, timed from the client's side.

Every timestamp comes from ``time.perf_counter_ns()``, taken right after the socket
read that delivered the bytes. Definitions (all wall seconds, from ``send``, the
moment just before the request is written; the body is serialized before that):

- ``ttfb_s``: until the response status line and headers have arrived;
- ``ttft_s``: until the first SSE event whose delta has non-empty ``content`` (chat) or
  ``text`` (completions); reasoning deltas are counted apart and never end TTFT;
- ``e2e_s``: until ``data: [DONE]`` (or the end of the body);
- inter-token latencies: gaps between consecutive content deltas (``itl_p50_s``,
  ``itl_max_s``);
- server usage (prompt, completion, cached tokens) from the final usage chunk.

Faults become a status, never an exception: ``connect_error``, ``http_error``,
``stream_error`` (reset, malformed or truncated SSE), ``timeout`` (no bytes for
``request_timeout_s``), ``no_content``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


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
    server_ns: int | None = None  # reference server's own time to first chunk (calibration)

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

    def output_digest(self) -> str | None:
        """Digest of the output tokens (logprob tokens when given, else the text)."""
        if not self.ok:
            return None
        basis = "\x1f".join(self.logprob_tokens) if self.logprob_tokens else self.text
        return hashlib.blake2b(basis.encode(), digest_size=8).hexdigest()

    def row(self) -> dict[str, Any]:
        """The measured part of a requests.parquet row."""
        itl = self.itl()
        return {
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "ttfb_s": self.ttfb_s,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "itl_p50_s": statistics.median(itl) if itl else None,
            "itl_max_s": max(itl) if itl else None,
            "output_chunks": len(self.chunk_ns),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "first_logprob": self.first_logprob,
            "output_digest": self.output_digest(),
            "output_text": self.text[:200] if self.ok else None,
        }


class _StreamFault(Exception):
    pass


def _handle_event(data: bytes, now: int, res: Result) -> bool:
    """Apply one SSE ``data:`` payload; True when it was ``[DONE]``."""
    if data == b"[DONE]":
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _StreamFault(f"malformed SSE data: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise _StreamFault(f"malformed SSE data: {data[:80]!r}")
    if "error" in obj:
        raise _StreamFault(f"server error in stream: {str(obj['error'])[:160]}")
    if "server_ns" in obj:
        res.server_ns = obj["server_ns"]
    usage = obj.get("usage")
    if usage:
        res.prompt_tokens = usage.get("prompt_tokens")
        res.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        res.cached_tokens = details.get("cached_tokens")
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
        _take_logprobs(choice.get("logprobs"), res)
    return False


def _take_logprobs(logprobs: Any, res: Result) -> None:
    if not logprobs:
        return
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


async def _read_stream(resp: aiohttp.ClientResponse, res: Result) -> None:
    """Parse SSE incrementally from raw bytes; timestamps at each read."""
    buf = b""
    done = False
    async for chunk in resp.content.iter_any():
        now = time.perf_counter_ns()
        buf += chunk
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            event, buf = buf[:end], buf[end + 2 :]
            for line in event.split(b"\n"):
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    done = _handle_event(line[5:].strip(), now, res) or done
        if done:
            break
    res.e2e_s = (time.perf_counter_ns() - res.send_ns) / 1e9
    if not done:
        raise _StreamFault("truncated stream: ended without data: [DONE]")


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    stream: bool = True,
    timeout_s: float = 900.0,
    extra_headers: dict[str, str] | None = None,
    pre_send_delay_s: float = 0.0,
) -> Result:
    """POST a pre-serialized body and measure it; faults are recorded in the result.

    ``pre_send_delay_s`` blocks inside the timed span before sending: a planted client
    delay for tests of the calibration, never used in measurements.
    """
    res = Result()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s, sock_connect=timeout_s)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if extra_headers:
        headers.update(extra_headers)
    res.send_ns = time.perf_counter_ns()
    if pre_send_delay_s:
        await asyncio.sleep(pre_send_delay_s)
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            res.ttfb_s = (time.perf_counter_ns() - res.send_ns) / 1e9
            res.http_status = resp.status
            if resp.status >= 400:
                text = await resp.text(errors="replace")
                res.status, res.error = "http_error", _error_message(resp.status, text)
                res.e2e_s = (time.perf_counter_ns() - res.send_ns) / 1e9
                return res
            if stream:
                await _read_stream(resp, res)
            else:
                await _read_whole(resp, res)
    except _StreamFault as exc:
        res.status, res.error = "stream_error", str(exc)
    except TimeoutError:
        res.status, res.error = "timeout", f"no bytes for {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        res.status, res.error = "connect_error", str(exc)[:200]
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        res.status, res.error = "stream_error", f"connection lost mid-stream: {exc!s}"[:200]
    except aiohttp.ClientError as exc:
        res.status, res.error = "stream_error", f"{type(exc).__name__}: {exc!s}"[:200]
    if res.status == "ok" and res.ttft_s is None:
        res.status, res.error = "no_content", "stream ended without any content delta"
    return res


async def _read_whole(resp: aiohttp.ClientResponse, res: Result) -> None:
    raw = await resp.read()
    now = time.perf_counter_ns()
    res.e2e_s = (now - res.send_ns) / 1e9
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _StreamFault("malformed JSON response") from None
    choice = (obj.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
    if text:
        res.ttft_s = res.e2e_s
        res.chunk_ns.append(now)
        res.pieces.append(text)
    usage = obj.get("usage") or {}
    res.prompt_tokens = usage.get("prompt_tokens")
    res.completion_tokens = usage.get("completion_tokens")
    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def _error_message(status: int, text: str) -> str:
    try:
        obj = orjson.loads(text)
        message = obj.get("error", {}).get("message") or obj.get("message") or text
    except (orjson.JSONDecodeError, AttributeError):
        message = text
    return f"HTTP {status}: {str(message).strip()[:200]}"


def new_client_session(concurrency: int, connect_timeout_s: float) -> aiohttp.ClientSession:
    """One client session for a run: connection reuse, no connection limit below need."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


def serialize(body: dict[str, Any]) -> bytes:
    """Request body bytes (orjson: several times faster than json for 1 MB bodies)."""
    return orjson.dumps(body)
