"""The OpenAI/vLLM wire format of the simulator: request parsing and response bodies.

Parsing is strict where a real server would refuse (missing or mistyped fields become a
:class:`BadRequest`, answered with 400 and an OpenAI-style error body) and lenient where
vLLM is (unknown fields are ignored). Response builders return plain dicts shaped like
vLLM's: ``chat.completion(.chunk)`` and ``text_completion`` objects, a final usage chunk
with empty ``choices``, ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from sessiongen.sim.output import Output, token_bytes, token_text

Api = Literal["chat", "completions"]
MAX_TOP_LOGPROBS = 20
#: The simulator's own request header: the request's modeled arrival (seconds on the
#: engine's clock), stated by a client that models it (see :mod:`sessiongen.sim.server`).
ARRIVAL_HEADER = "X-Sim-Arrival-S"
#: The request's identity for its service-time noise, stated by the same client
#: (:func:`sessiongen.experiment.script.turn_key`), so that the factor does not depend on
#: the arrival order.
REQUEST_KEY_HEADER = "X-Sim-Request-Key"


class BadRequest(Exception):
    """A request the server refuses with 400; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def error_body(message: str, param: str | None = None, code: int = 400) -> dict[str, Any]:
    """The OpenAI error body vLLM sends."""
    kind = "BadRequestError" if code == 400 else "NotFoundError" if code == 404 else "Error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class GenRequest:
    """A validated generation request (chat or completions)."""

    api: Api
    model: str
    messages: tuple[tuple[str, str], ...] = ()
    prompt_text: str | None = None
    prompt_ids: NDArray[np.uint32] | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0


def _int(body: dict[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequest(f"{name} must be an integer >= {low}, got {value!r}", name)
    return value


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {value!r}", name)
    return value


def _content(message: Any, i: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise BadRequest(f"messages[{i}] must be an object", "messages")
    role, content = message.get("role"), message.get("content", "")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"messages[{i}].role is required", "messages")
    if content is None:
        content = ""
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
        content = "".join(texts)  # type: ignore[arg-type]
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or text parts", "messages")
    return role, content


def _prompt(body: dict[str, Any]) -> tuple[str | None, NDArray[np.uint32] | None]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        try:
            ids = np.array(prompt)  # vectorised check: a 128k-token list costs ~2 ms
        except (ValueError, OverflowError):
            ids = np.zeros(0)
        if ids.ndim == 1 and ids.dtype.kind in "iu" and ids.min() >= 0 and ids.max() < 2**32:
            return None, ids.astype(np.uint32)
    if prompt is None:
        raise BadRequest("prompt is required", "prompt")
    raise BadRequest("prompt must be a string or a non-empty list of token ids", "prompt")


def parse_generation(body: Any, api: Api) -> GenRequest:
    """Validate a chat or completions request body (already JSON-decoded)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required", "model")
    if _int(body, "n", 1, 1) != 1:
        raise BadRequest("only n = 1 is supported", "n")
    messages: tuple[tuple[str, str], ...] = ()
    text: str | None = None
    ids: NDArray[np.uint32] | None = None
    if api == "chat":
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("messages must be a non-empty list", "messages")
        messages = tuple(_content(m, i) for i, m in enumerate(raw))
        max_tokens = _int(body, "max_completion_tokens", None, 1)
        max_tokens = _int(body, "max_tokens", max_tokens, 1)
        want_logprobs = _bool(body, "logprobs", False)
        top = _int(body, "top_logprobs", 0, 0) or 0
    else:
        text, ids = _prompt(body)
        max_tokens = _int(body, "max_tokens", 16, 1)
        top = _int(body, "logprobs", None, 0) or 0
        want_logprobs = body.get("logprobs") is not None
    if top > MAX_TOP_LOGPROBS:
        raise BadRequest(f"at most {MAX_TOP_LOGPROBS} top logprobs", "logprobs")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise BadRequest("temperature must be a number", "temperature")
    min_tokens = _int(body, "min_tokens", 0, 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise BadRequest("min_tokens must not exceed max_tokens", "min_tokens")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    return GenRequest(
        api=api,
        model=model,
        messages=messages,
        prompt_text=text,
        prompt_ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(body, "ignore_eos", False),
        temperature=float(temperature),
        seed=_int(body, "seed", None, -(2**63)),
        stream=stream,
        include_usage=stream and bool(options.get("include_usage", False)),
        logprobs=want_logprobs,
        top_logprobs=top,
    )


class Responder:
    """Builds the response objects of one request (ids, timestamps, formats)."""

    def __init__(self, req: GenRequest, model: str) -> None:
        self.req = req
        self.model = model
        prefix = "chatcmpl" if req.api == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if req.api == "chat" else "text_completion"
        self._text_pos = 0

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def usage(self, prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def role_chunk(self) -> dict[str, Any]:
        """The first chat chunk: the assistant role and empty content."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._envelope("chat.completion.chunk", [choice])

    def token_chunk(self, out: Output, start: int, stop: int) -> dict[str, Any]:
        """A content chunk carrying tokens ``start:stop`` (finish reason on the last one)."""
        text = "".join(out.pieces[start:stop])
        last = stop == len(out.ids)
        finish = out.finish_reason if last else None
        logprobs = self.logprobs(out, start, stop, self._text_pos) if self.req.logprobs else None
        self._text_pos += len(text)
        if self.req.api == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "stop_reason": None}
            obj = "text_completion"
        choice.update({"logprobs": logprobs, "finish_reason": finish})
        return self._envelope(obj, [choice])

    def usage_chunk(self, usage: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """The final streamed chunk: no choices, the usage, and the simulator's own facts."""
        obj = "chat.completion.chunk" if self.req.api == "chat" else "text_completion"
        body = self._envelope(obj, [])
        body["usage"] = usage
        body["sim"] = extra
        return body

    def full(self, out: Output, usage: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming response."""
        logprobs = self.logprobs(out, 0, len(out.ids), 0) if self.req.logprobs else None
        if self.req.api == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": out.text},
            }
        else:
            choice = {"index": 0, "text": out.text, "stop_reason": None}
        choice.update({"logprobs": logprobs, "finish_reason": out.finish_reason})
        body = self._envelope(self.object, [choice])
        body["usage"] = usage
        body["sim"] = extra
        return body

    def logprobs(self, out: Output, start: int, stop: int, text_offset: int) -> dict[str, Any]:
        """Logprobs of tokens ``start:stop`` in the chat or the completions shape."""
        if self.req.api == "chat":
            content = []
            for i in range(start, stop):
                tid = out.ids[i]
                tops = [
                    {"token": token_text(t), "logprob": lp, "bytes": token_bytes(t)}
                    for t, lp in out.top[i][: self.req.top_logprobs]
                ]
                entry = {"token": token_text(tid), "logprob": out.logprobs[i]}
                entry.update({"bytes": token_bytes(tid), "top_logprobs": tops})
                content.append(entry)
            return {"content": content}
        offsets, pos = [], text_offset
        for piece in out.pieces[start:stop]:
            offsets.append(pos)
            pos += len(piece)
        return {
            "tokens": [token_text(t) for t in out.ids[start:stop]],
            "token_logprobs": out.logprobs[start:stop],
            "top_logprobs": [
                {token_text(t): lp for t, lp in out.top[i][: max(self.req.top_logprobs, 1)]}
                for i in range(start, stop)
            ],
            "text_offset": offsets,
        }
