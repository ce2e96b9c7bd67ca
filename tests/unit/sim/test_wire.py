"""The simulator on the wire: the openai client and raw SSE both work, like against vLLM."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from sessiongen.scenario.simprofile import SimProfile
from tests.conftest import SimServers

MODEL = "sim-27b"
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Tell me about rivers and stones. " * 300},
]


def client(server: TestServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="none", max_retries=0)


async def sse_events(
    server: TestServer, path: str, body: dict[str, Any]
) -> tuple[list[Any], list[bytes]]:
    """POST and parse the SSE stream by hand: (decoded events, raw data lines)."""
    events: list[Any] = []
    lines: list[bytes] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url(path), json=body) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.rstrip(b"\n")
            if not line:
                continue
            assert line.startswith(b"data: ")
            lines.append(line)
            if line != b"data: [DONE]":
                events.append(orjson.loads(line[6:]))
    return events, lines


async def test_openai_client_streams_chat_with_usage(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    stream = await client(server).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-2].choices[0].finish_reason == "length"


async def test_openai_client_non_streaming_chat_and_completions(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    oa = client(server)
    chat = await oa.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=7,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 7
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 7
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)
    assert "".join(c.token for c in content) == chat.choices[0].message.content

    comp = await oa.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, logprobs=2
    )
    assert comp.usage is not None and comp.usage.completion_tokens <= 5
    lp = comp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == comp.choices[0].text
    assert len(lp.top_logprobs[0]) == 2


async def test_openai_client_streams_completions(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    stream = await client(server).completions.create(
        model=MODEL,
        prompt=[1, 2, 3, 4, 5],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert sum(1 for c in chunks if c.choices) <= 4
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 5


async def test_raw_sse_chat_format(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 9,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events, lines = await sse_events(server, "/v1/chat/completions", body)
    assert lines[-1] == b"data: [DONE]"
    first, *content, usage = events
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(content) == 9  # one token per content chunk
    assert all(e["choices"][0]["delta"]["content"] for e in content)
    assert [e["choices"][0]["finish_reason"] for e in content] == [None] * 8 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 9
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len({e["id"] for e in events}) == 1


async def test_raw_sse_without_usage_ends_with_done(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 3, "stream": True}
    events, lines = await sse_events(server, "/v1/completions", body)
    assert lines[-1] == b"data: [DONE]"
    assert all(e["choices"] and e["object"] == "text_completion" for e in events)


async def post(server: TestServer, path: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url(path), data=data) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


async def test_outputs_are_deterministic_in_prompt_and_seed(sim_servers: SimServers) -> None:
    a, b = await sim_servers()
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, "ignore_eos": True}
    greedy = {**body, "temperature": 0}
    texts, cached = [], []
    for server in (a, a, b):  # cold, local hit, pool hit: same text every time
        _, out = await post(server, "/v1/chat/completions", greedy)
        texts.append(out["choices"][0]["message"]["content"])
        cached.append(out["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert texts[0] == texts[1] == texts[2]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0
    seeded = [
        (await post(a, "/v1/chat/completions", {**body, "temperature": 1, "seed": s}))[1]
        for s in (1, 1, 2)
    ]
    seeded_texts = [o["choices"][0]["message"]["content"] for o in seeded]
    assert seeded_texts[0] == seeded_texts[1] != seeded_texts[2]
    unseeded = [
        (await post(a, "/v1/chat/completions", {**body, "temperature": 1}))[1] for _ in range(2)
    ]
    assert len({o["choices"][0]["message"]["content"] for o in unseeded}) == 2


async def test_max_min_tokens_and_ignore_eos(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    lengths, reasons = set(), set()
    for i in range(12):
        prompt = f"Prompt number {i} about rivers."
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 600, "min_tokens": 20}
        _, out = await post(server, "/v1/completions", body)
        n = out["usage"]["completion_tokens"]
        assert 20 <= n <= 600
        lengths.add(n)
        reasons.add(out["choices"][0]["finish_reason"])
        _, exact = await post(server, "/v1/completions", {**body, "ignore_eos": True})
        assert exact["usage"]["completion_tokens"] == 600
        assert exact["choices"][0]["finish_reason"] == "length"
    assert len(lengths) > 1 and "stop" in reasons  # early EOS happens without ignore_eos


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": "nope", "messages": MESSAGES}, "model"),
        ("/v1/chat/completions", {"messages": MESSAGES}, "model"),
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, "messages"),
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**6}, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"[1, 2]", None),
    ],
)
async def test_bad_requests_get_400_with_openai_error_body(
    sim_servers: SimServers, path: str, body: Any, param: str | None
) -> None:
    (server, _) = await sim_servers()
    status, data = await post(server, path, body)
    assert status == 400
    assert set(data["error"]) == {"message", "type", "param", "code"}
    assert data["error"]["type"] == "BadRequestError" and data["error"]["code"] == 400
    assert data["error"]["param"] == param and data["error"]["message"]


async def test_prompt_longer_than_the_context_limit_is_refused(sim_servers: SimServers) -> None:
    profile = SimProfile(time_scale=0.001, max_model_len=1024)
    (server, _) = await sim_servers(profile)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024"):
        await client(server).completions.create(model=MODEL, prompt=list(range(1020)), max_tokens=5)


async def test_info_routes(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    async with aiohttp.ClientSession() as session:
        async with session.get(server.make_url("/health")) as resp:
            assert resp.status == 200
        async with session.get(server.make_url("/v1/models")) as resp:
            models = await resp.json()
            assert [m["id"] for m in models["data"]] == [MODEL]
        async with session.get(server.make_url("/version")) as resp:
            version = await resp.json()
            assert "sessiongen" in version["version"] and version["simulated"] is True
    listed = await client(server).models.list()
    assert [m.id for m in listed.data] == [MODEL]


async def test_tokenize_counts_what_generation_counts(sim_servers: SimServers) -> None:
    (server, _) = await sim_servers()
    status, tok = await post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES})
    assert status == 200 and set(tok) == {"count", "max_model_len", "tokens"}
    assert tok["count"] == len(tok["tokens"])
    _, out = await post(
        server, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    )
    assert out["usage"]["prompt_tokens"] == tok["count"]
    _, plain = await post(server, "/tokenize", {"prompt": "hello world"})
    assert plain["tokens"] == [15339, 1917]  # cl100k
    status, bad = await post(server, "/tokenize", {"model": "other", "prompt": "x"})
    assert status == 400 and bad["error"]["param"] == "model"
