"""A misbehaving OpenAI-compatible test server for driver and replay fault tests.

``make_app(mode)`` answers ``/v1/chat/completions`` and ``/v1/completions`` by mode:
``ok`` (role chunk, N content chunks, usage chunk, [DONE] after ``delay_s``), ``http500``,
``http400``, ``reset`` (drops the connection mid-stream), ``malformed`` (a non-JSON
data line), ``truncated`` (ends without [DONE]), ``stall`` (sends headers, then
nothing), ``reasoning`` (reasoning deltas before content), ``empty`` (no content).
Mode can also be chosen per request with the ``X-Fake-Mode`` header or per turn via
``fail_on`` (a predicate on the request number).

``deterministic=True`` makes the ``ok`` answer a function of the prompt, the way a
greedy model's is: its words, token ids and logprobs (returned when the body asks for
``logprobs``, as ``token_id:N`` tokens) come from a hash of the messages or prompt, so
the same prompt gets the same answer on every replica and different prompts differ.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

STATE = web.AppKey("state", dict)


def _chunk(obj: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def answer_of(body: dict[str, Any], chunks: int) -> list[tuple[str, int, float]]:
    """The deterministic answer to a request: (piece, token id, logprob) per chunk."""
    prompt = orjson.dumps(body.get("messages") or body.get("prompt"), option=orjson.OPT_SORT_KEYS)
    out = []
    for i in range(chunks):
        h = int.from_bytes(hashlib.blake2b(prompt + bytes([i]), digest_size=8).digest(), "little")
        token = 1000 + h % 50_000
        out.append((f" w{token}", token, -((h >> 20) % 1000) / 2000.0))
    return out


def _choice(chat: bool, piece: str, token: int | None, lp: float | None) -> dict[str, Any]:
    """One streamed choice; with logprobs when ``token`` is given (vLLM's token-id form)."""
    choice: dict[str, Any] = (
        {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
    )
    if token is not None:
        name = f"token_id:{token}"
        choice["logprobs"] = (
            {"content": [{"token": name, "logprob": lp}]}
            if chat
            else {"tokens": [name], "token_logprobs": [lp]}
        )
    return choice


def make_app(
    mode: str = "ok",
    *,
    delay_s: float = 0.0,
    chunks: int = 4,
    fail_on: Callable[[int], str | None] | None = None,
    model: str = "sim-27b",
    deterministic: bool = False,
) -> web.Application:
    state = {"n": 0}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state["n"] += 1
        current = (fail_on(state["n"]) if fail_on else None) or mode
        if current == "http500":
            return web.json_response({"error": {"message": "boom", "code": 500}}, status=500)
        if current == "http400":
            return web.json_response({"error": {"message": "bad model", "code": 400}}, status=400)
        chat = "messages" in body
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if current == "stall":
            await asyncio.sleep(3600)
        await asyncio.sleep(delay_s)
        if chat:
            await resp.write(_chunk({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        if current == "reasoning":
            for _ in range(2):
                await resp.write(
                    _chunk({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]})
                )
                await asyncio.sleep(0.01)
        if current == "malformed":
            await resp.write(b"data: {not json\n\n")
        answer = answer_of(body, chunks) if deterministic else None
        logprobs = bool(body.get("logprobs"))
        for i in range(0 if current == "empty" else chunks):
            if current == "reset" and i == 1:
                assert request.transport is not None
                request.transport.close()
                return resp
            piece, token, lp = answer[i] if answer else (f" tok{i}", None, None)
            choice = _choice(chat, piece, token if logprobs else None, lp)
            await resp.write(_chunk({"choices": [choice]}))
        if current == "truncated":
            return resp
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": chunks,
            "total_tokens": 10 + chunks,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        await resp.write(_chunk({"choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


#: How long a :class:`ThreadServer` may take to listen.
READY_DEADLINE_S = 120.0


class ThreadServer:
    """Runs an aiohttp app on a free port in a background thread (for sync callers)."""

    def __init__(self, app: web.Application) -> None:
        import threading

        self.app = app
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.url = ""

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self.app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        # Polled, generous: a busy 2-core machine once took over 10 s here, and the test
        # then sent to an empty URL.
        if not self._ready.wait(READY_DEADLINE_S):
            raise RuntimeError(f"fake server not listening after {READY_DEADLINE_S:g} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
