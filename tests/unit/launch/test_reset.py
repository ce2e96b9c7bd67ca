"""Resetting a running pair's caches between blocks, and the managed target's choice
between a reset and a restart: against fake replicas that keep a prefix cache and a
shared pool the way vLLM and LMCache do (whole prompts stand in for blocks)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sessiongen import scenario
from sessiongen.launch import reset
from sessiongen.targets import managed


@dataclass
class FakeStack:
    """Replicas with a local prefix cache each, and one pool shared by all of them."""

    replicas: int = 2
    pool_on: bool = True
    dev_mode: bool = True
    clear_works: bool = True
    busy_answers: int = 0  # reset answers {"success": false} this many times first
    pool: set[str] = field(default_factory=set)
    local: list[set[str]] = field(default_factory=list)
    counters: list[dict[str, int]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.local = [set() for _ in range(self.replicas)]
        self.counters = [{"local": 0, "external": 0} for _ in range(self.replicas)]

    def chat(self, replica: int, text: str) -> dict[str, Any]:
        tokens = len(text.split()) + 7
        whole = tokens // 128 * 128
        cached = 0
        if text in self.local[replica]:
            self.counters[replica]["local"] += whole
            cached = whole
        elif self.pool_on and text in self.pool:
            self.counters[replica]["external"] += whole
            cached = whole
        self.local[replica].add(text)
        if self.pool_on:
            self.pool.add(text)
        details = {"cached_tokens": cached}
        return {"usage": {"prompt_tokens": tokens, "prompt_tokens_details": details}}


def serve(stack: FakeStack, replica: int | None) -> ThreadingHTTPServer:
    """One fake replica (``replica`` its index) or the fake LMCache server (None)."""

    class Handler(BaseHTTPRequestHandler):
        def reply(self, status: int, body: Any = None, text: str | None = None) -> None:
            data = text.encode() if text is not None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if replica is None or self.path != "/metrics":
                return self.reply(404, {"detail": "Not Found"})
            c = stack.counters[replica]
            lines = [
                f'vllm:prefix_cache_hits_total{{model_name="tiny"}} {c["local"]}',
                f'vllm:external_prefix_cache_hits_total{{model_name="tiny"}} {c["external"]}',
            ]
            self.reply(200, text="\n".join(lines) + "\n")

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size) or b"null")
            stack.calls.append(f"{'lmcache' if replica is None else replica} {self.path}")
            if replica is None and self.path == "/cache/clear":
                if stack.clear_works:
                    stack.pool.clear()
                return self.reply(200, {"status": "ok", "cleared": {"tier": "l1"}})
            if replica is not None and self.path == "/reset_prefix_cache":
                if not stack.dev_mode:
                    return self.reply(404, {"detail": "Not Found"})
                if stack.busy_answers > 0:
                    stack.busy_answers -= 1
                    return self.reply(200, {"success": False})
                stack.local[replica].clear()
                return self.reply(200, {"success": True})
            if replica is not None and self.path == "/v1/chat/completions":
                return self.reply(200, stack.chat(replica, body["messages"][0]["content"]))
            self.reply(404, {"detail": "Not Found"})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def urls() -> Iterator[Any]:
    """``urls(stack)`` -> (replica URLs, LMCache URL or None); servers stopped after."""
    servers: list[ThreadingHTTPServer] = []

    def start(stack: FakeStack) -> tuple[list[str], str | None]:
        reps = [serve(stack, i) for i in range(stack.replicas)]
        pool = serve(stack, None) if stack.pool_on else None
        servers.extend(reps + ([pool] if pool else []))
        url = "http://127.0.0.1:{}".format
        return [url(s.server_port) for s in reps], url(pool.server_port) if pool else None

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_verified_reset_empties_pool_and_local_caches(urls: Any) -> None:
    stack = FakeStack(busy_answers=2)  # a replica still busy at first: retried
    facts = reset.verified_reset(*urls(stack), "tiny", probe_tokens=600)
    assert facts["verified"] is True, facts
    # Before the reset the next replica read each probe from the pool: the pool held them.
    own, read = facts["seeded"][:2], facts["seeded"][2:]
    assert [row["cached_tokens"] for row in own] == [0, 0]
    assert all(row["external_hits"] == row["cached_tokens"] >= 512 for row in read)
    assert all(
        row["cached_tokens"] == 0 and row["local_hits"] == row["external_hits"] == 0
        for row in facts["probe"]
    )
    assert stack.pool == set() and stack.local == [set(), set()]  # the probe's traces too
    assert "lmcache POST /cache/clear" in facts["method"]


def test_a_pool_left_full_fails_the_probe(urls: Any) -> None:
    stack = FakeStack(clear_works=False)
    facts = reset.verified_reset(*urls(stack), "tiny", probe_tokens=600)
    assert facts["verified"] is False
    assert "not cold after the reset: replica 0" in facts["reason"]
    assert "external hits" in facts["reason"]


def test_replicas_without_dev_mode_cannot_reset(urls: Any) -> None:
    stack = FakeStack(pool_on=False, dev_mode=False)
    facts = reset.verified_reset(*urls(stack), "tiny", probe_tokens=600)
    assert facts["verified"] is False
    assert "HTTP 404 (is VLLM_SERVER_DEV_MODE=1 set?)" in facts["reason"]


def test_cache_off_reset_needs_no_pool(urls: Any) -> None:
    stack = FakeStack(pool_on=False)
    facts = reset.verified_reset(*urls(stack), "tiny", probe_tokens=600)
    assert facts["verified"] is True
    assert len(facts["seeded"]) == 2  # no pool to read from
    assert not any(call.startswith("lmcache") for call in stack.calls)


# ----------------------------------------------------------------- the target's choice


class FakePair:
    """Stands in for ManagedPair: counts starts, stops and resets."""

    started: ClassVar[list[FakePair]] = []
    probe_ok: ClassVar[bool] = True

    def __init__(self, spec: Any, model: str, cache_on: bool, log_dir: Path, **kw: Any) -> None:
        self.cache_on = cache_on
        self.log_dir = log_dir
        self.resettable = kw.get("resettable", False)
        self.ready_s: float | None = None
        self.stopped = False
        self.resets = 0
        self.urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
        self.processes: list[dict[str, Any]] = []
        self.model_arg = "m"

    def start(self) -> None:
        FakePair.started.append(self)
        self.ready_s = 1.5

    def stop(self) -> dict[str, str]:
        self.stopped = True
        return {"replica-0": "stopped"}

    def reset_caches(self) -> dict[str, Any]:
        self.resets += 1
        if self.resettable and FakePair.probe_ok:
            return {"verified": True, "method": "fake"}
        return {"verified": False, "reason": "cold probe not cold after the reset: replica 0"}

    def dead_replicas(self) -> list[int]:
        return []

    def lmcache_alive(self) -> bool:
        return True


def run_blocks(
    blocks: list[str], *, restart: bool, run_dir: Path
) -> tuple[list[dict[str, Any]], Any]:
    """Open and close the blocks the way replay does; their facts, and the target."""
    sc = scenario.from_dict(
        {
            "name": "reset-test",
            "model": {"name": "tiny"},
            "design": {"blocks": blocks, "restart_between_blocks": restart},
            "target": {"kind": "managed", "managed": {"model": "/nonexistent"}},
        }
    )
    target = managed.ManagedTarget(sc)
    target.attach(run_dir)

    async def go() -> list[dict[str, Any]]:
        out = []
        for i, cache in enumerate(blocks):
            await target.open_block(cache)
            following = blocks[i + 1] if i + 1 < len(blocks) else None
            out.append(dict(await target.close_block(next_cache=following)))
        await target.close()
        return out

    return asyncio.run(go()), target


@pytest.fixture
def fake_pairs(monkeypatch: pytest.MonkeyPatch) -> type[FakePair]:
    monkeypatch.setattr(managed, "ManagedPair", FakePair)
    monkeypatch.setattr(FakePair, "started", [])
    monkeypatch.setattr(FakePair, "probe_ok", True)
    return FakePair


def test_same_arm_blocks_reset_instead_of_restarting(
    fake_pairs: type[FakePair], tmp_path: Path
) -> None:
    facts, target = run_blocks(["off", "on", "on", "off", "off"], restart=False, run_dir=tmp_path)
    assert len(fake_pairs.started) == 3  # off | on, on | off, off
    assert [f["restarted"] for f in facts] == [True, True, False, True, False]
    assert [f.get("kept", False) for f in facts] == [False, True, False, True, False]
    assert facts[2]["reset"]["verified"] is True and "startup_s" not in facts[2]
    assert (tmp_path / "block-2").is_dir()  # a reused block's router logs there
    assert facts[1]["startup_s"] == 1.5
    assert all(p.resettable and p.stopped for p in fake_pairs.started)
    described = target.describe()["blocks"]
    assert [b["restarted"] for b in described] == [f["restarted"] for f in facts]


def test_fresh_replicas_per_block_stay_available(
    fake_pairs: type[FakePair], tmp_path: Path
) -> None:
    facts, _ = run_blocks(["off", "on", "on", "off"], restart=True, run_dir=tmp_path)
    assert len(fake_pairs.started) == 4
    assert all(f["restarted"] and "reset" not in f and "stop" in f for f in facts)
    assert not any(p.resettable for p in fake_pairs.started)  # no dev mode when not needed


def test_a_failed_cold_probe_falls_back_to_a_restart(
    fake_pairs: type[FakePair], tmp_path: Path
) -> None:
    fake_pairs.probe_ok = False
    facts, _ = run_blocks(["on", "on"], restart=False, run_dir=tmp_path)
    assert len(fake_pairs.started) == 2
    second = facts[1]
    assert second["restarted"] is True and second["reset"]["fallback"] == "restart"
    assert "not cold" in second["reset"]["reason"]
    assert fake_pairs.started[0].stopped
