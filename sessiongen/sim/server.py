"""The simulated replicas' HTTP servers: one aiohttp app per replica, vLLM's wire format.

``make_apps`` builds the apps of one :class:`~sessiongen.sim.engine.World` (all replicas
share its pool and run on one event loop). Routes: ``POST /v1/chat/completions``,
``POST /v1/completions`` (streaming SSE or not), ``GET /health``, ``GET /v1/models``,
``GET /version``, ``POST /tokenize``, ``GET /metrics``, and the admin routes
``POST /sim/reset`` (``{"pool": true}`` also clears the pool) and ``GET|POST /sim/config``
(``{"shared_cache": bool, "time_scale": float}``) that let one process switch arms.

Each response carries the simulator's own account of the request: ``X-Sim-*`` headers on
non-streaming responses and a ``sim`` object on the final usage chunk (and on
non-streaming bodies): local and pool hit tokens, modeled TTFT, queueing and time to
the last token, preemptions, the KV blocks in use when it was admitted (and the batch
it joined), and how late the first byte was written against its deadline (``late_s``,
wall seconds).

A client that goes away aborts its request in the engine (its KV blocks are freed), as
vLLM does.

Modeled arrivals: a request with an ``X-Sim-Arrival-S`` header arrives at that modeled
time (seconds on the engine's clock, which ``GET /sim/config`` reports as
``modeled_now_s``, with ``clock`` naming the engine), not at its handler's entry on the
wall clock, so the engine sees arrivals in the order and at the times the client
modeled, however the machine's load delays the requests. A client sends such a request
ahead of its time; one that comes after the engine has passed its time joins the next
step, and its ``arrival_late_s`` fact says by how much (modeled seconds; 0 when on
time, null for a request that stated no arrival). Responses carry the absolute
``modeled_arrival_s`` and ``modeled_end_s``, from which a client models the next.
An ``X-Sim-Request-Key`` header names the request (``seed/block/session/turn``) for its
service-time noise, which then does not depend on the order of arrivals either.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from sessiongen._version import __version__
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.compiled import Engine
from sessiongen.sim.engine import Job, Replica, Served, World
from sessiongen.sim.noise import MAX_KEY_CHARS
from sessiongen.sim.output import Output
from sessiongen.sim.wire import (
    ARRIVAL_HEADER,
    REQUEST_KEY_HEADER,
    Api,
    BadRequest,
    Responder,
    error_body,
    parse_generation,
)

log = logging.getLogger("sessiongen.sim")

REPLICA: web.AppKey[Replica] = web.AppKey("replica", Replica)
MAX_BODY_BYTES = 256 * 2**20
# Sleep until this long before a first-token deadline, then yield until it passes:
# epoll rounds timeouts up to whole milliseconds.
_SPIN_S = 0.0015
# Decode writes of all streams together, per wall second, before a stream's writes are
# spaced out (tokens due meanwhile go out in one write). Writing one SSE chunk costs
# the loop some 20-40 us; 1,000 streams at a step every 10 ms wall would need 100,000
# writes a second and delay every first token behind them. First tokens are always
# written at their exact time.
_WRITES_PER_S = 4000.0


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


def bad_request(exc: BadRequest) -> web.Response:
    """400 with the OpenAI error body."""
    return _json(error_body(exc.message, exc.param), status=400)


async def _sleep_until(deadline: float, precise: bool = False) -> None:
    loop = asyncio.get_running_loop()
    delay = deadline - loop.time()
    if not precise:
        if delay > 0:
            await asyncio.sleep(delay)
        return
    if delay > _SPIN_S:
        await asyncio.sleep(delay - _SPIN_S)
    while loop.time() < deadline:
        await asyncio.sleep(0)


def _warn_late(world: World, replica: int, late_s: float, own_work_s: float) -> None:
    """Say (at most once a second) that a first token was due before it could be written."""
    now = time.monotonic()
    if now - world.late_warned_at >= 1.0:
        world.late_warned_at = now
        log.warning(
            "replica %d: a first token was due %.1f ms before its handler could write it "
            "(own work %.1f ms); the simulator is short of CPU",
            replica,
            1000 * late_s,
            1000 * own_work_s,
        )


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Generation:
    """One generation request on one replica, from arrival to the last token."""

    def __init__(
        self,
        replica: Replica,
        job: Job,
        arrival: float,
        modeled_arrival: float | None = None,
        noise_key: str | None = None,
    ) -> None:
        self.replica = replica
        self.noise_key = noise_key  # the client's, where it said one
        self.world = replica.world
        self.job = job
        self.arrival = arrival  # loop time at the handler's entry
        self.modeled_arrival = modeled_arrival  # the client's, where it said one
        self.arrival_late_s: float | None = None  # only where an arrival was stated
        self.prepared_at = asyncio.get_running_loop().time()
        self.responder = Responder(job.req, replica.world.model_name)
        self.time_scale = self.world.time_scale
        self._served: Served | None = None

    @property
    def served(self) -> Served:
        assert self._served is not None
        return self._served

    async def start(self) -> Output:
        """Submit the request and wait until the time of its first token is known (one
        step ahead of it). An output that depends on the pool hit (a planted fault) is
        generated once the request is admitted, while its prefill is modeled."""
        world = self.world
        stated = self.modeled_arrival
        if stated is not None:
            self.arrival_late_s = max(0.0, world.cluster.now - stated)
        served = world.submit(self.job, self.replica.index, self.arrival, stated, self.noise_key)
        self._served = served
        await served.admitted
        loop = asyncio.get_running_loop()
        ready = self.job.output
        if ready is None:
            out, keys = await loop.run_in_executor(
                None, world.complete, self.job, served.sim.pool_hit
            )
            served.sim.set_keys(keys)
        else:
            out = ready
        await served.wait_tokens(1)
        late = loop.time() - world.wall(served.token_times[0])
        if late > 0:
            _warn_late(world, self.replica.index, late, self.prepared_at - self.arrival)
        return out

    @property
    def due(self) -> float:
        """Loop time of the request's arrival: the stated modeled one, else the entry."""
        if self.modeled_arrival is None:
            return self.arrival
        return self.world.wall(self.modeled_arrival)

    def abort(self) -> None:
        if self._served is not None:
            self.world.abort(self._served)

    def extra(self, first_byte_at: float | None) -> dict[str, Any]:
        """The simulator's own account of this request (modeled and wall seconds)."""
        served = self.served
        due = self.due
        target = self.world.wall(served.token_times[0]) - due
        facts = served.facts()
        facts.update(
            time_scale=self.time_scale,
            own_work_s=self.prepared_at - self.arrival,
            target_ttft_s=target,
            modeled_arrival_s=served.sim.arrival,
            arrival_late_s=self.arrival_late_s,
            # wall seconds from the handler's entry to the stated arrival's wall time
            # (negative: the request came in after it, and the engine, not yet past it,
            # back-dated it): what a client that states arrivals takes off its durations
            due_after_entry_s=due - self.arrival,
        )
        if len(served.token_times) == served.sim.output_tokens:
            facts["modeled_end_s"] = served.token_times[-1]
        if first_byte_at is not None:
            facts["wall_ttft_s"] = first_byte_at - due
            facts["late_s"] = first_byte_at - due - target
        return facts

    def usage(self, out: Output) -> dict[str, Any]:
        sim = self.served.sim
        return self.responder.usage(
            self.job.prompt_tokens, len(out.ids), sim.local_hit + sim.pool_hit
        )

    def log(self) -> None:
        sim = self.served.sim
        assert sim.admitted_at is not None and sim.first_token_at is not None
        log.info(
            "replica=%d prompt_tokens=%d local_hit=%d pool_hit=%d ttft_modeled=%.4fs "
            "queue_modeled=%.4fs",
            self.replica.index,
            self.job.prompt_tokens,
            sim.local_hit,
            sim.pool_hit,
            sim.first_token_at - sim.arrival,
            sim.admitted_at - sim.arrival,
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Serve as server-sent events, one token per content chunk."""
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Sim-Replica": str(self.replica.index),
            }
        )
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        try:
            out = await self.start()
            self.log()
            await _sleep_until(self.world.wall(self.served.token_times[0]), precise=True)
            chat = self.job.req.api == "chat"
            head = _sse(self.responder.role_chunk()) if chat else b""
            await resp.write(head + _sse(self.responder.token_chunk(out, 0, 1)))
            first_byte_at = loop.time()
            self.replica.metrics.generation_tokens.inc(len(out.ids))
            await self._decode(resp, out)
        except BaseException:
            self.abort()
            raise
        tail = b""
        if self.job.req.include_usage:
            chunk = self.responder.usage_chunk(self.usage(out), self.extra(first_byte_at))
            tail = _sse(chunk)
        await resp.write_eof(tail + b"data: [DONE]\n\n")  # one send with the last chunk
        return resp

    async def _decode(self, resp: web.StreamResponse, out: Output) -> None:
        """Write tokens 1.. at their times; tokens already due go out in one write.

        With many streams a stream writes at most every ``streams / _WRITES_PER_S``
        wall seconds (modeled times, and so the usage facts, are unaffected).
        """
        loop = asyncio.get_running_loop()
        served, world = self.served, self.world
        wall = world.wall
        count, sent, last_write = len(out.ids), 1, loop.time()
        world.streams += 1
        try:
            while sent < count:
                await served.wait_tokens(sent + 1)
                gap = world.streams / _WRITES_PER_S
                await _sleep_until(max(wall(served.token_times[sent]), last_write + gap))
                now, due = loop.time(), sent + 1
                known = min(count, len(served.token_times))
                while due < known and wall(served.token_times[due]) <= now:
                    due += 1
                chunks = (_sse(self.responder.token_chunk(out, i, i + 1)) for i in range(sent, due))
                await resp.write(b"".join(chunks))
                sent, last_write = due, now
        finally:
            world.streams -= 1

    async def whole(self) -> web.Response:
        """Serve as one JSON response at the last token's time."""
        try:
            out = await self.start()
            self.log()
            self.replica.metrics.generation_tokens.inc(len(out.ids))
            await self.served.wait_finished()
            await _sleep_until(self.world.wall(self.served.token_times[-1]))
        except BaseException:
            self.abort()
            raise
        extra = self.extra(None)
        sim = self.served.sim
        headers = {
            "X-Sim-Replica": str(self.replica.index),
            "X-Sim-Local-Hit-Tokens": str(sim.local_hit),
            "X-Sim-Pool-Hit-Tokens": str(sim.pool_hit),
            "X-Sim-Modeled-TTFT-S": f"{extra['modeled_ttft_s']:.6f}",
            "X-Sim-Time-Scale": repr(self.time_scale),
        }
        return _json(self.responder.full(out, self.usage(out), extra), headers=headers)


async def _generate(request: web.Request, api: Api) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    arrival = loop.time()
    replica = request.app[REPLICA]
    raw = await request.read()
    try:
        stated = _stated_arrival(request)
        key = _request_key(request)
        job = await loop.run_in_executor(None, replica.world.prepare, raw, api)
    except BadRequest as exc:
        return bad_request(exc)
    gen = _Generation(replica, job, arrival, stated, key)
    return await gen.stream(request) if job.req.stream else await gen.whole()


def _stated_arrival(request: web.Request) -> float | None:
    """The modeled arrival the client states (``X-Sim-Arrival-S``), if any."""
    raw = request.headers.get(ARRIVAL_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise BadRequest(f"{ARRIVAL_HEADER} must be a number of modeled seconds >= 0")
    return value


def _request_key(request: web.Request) -> str | None:
    """The request's noise key (``X-Sim-Request-Key``), if the client states one."""
    key = request.headers.get(REQUEST_KEY_HEADER)
    if key is not None and not 0 < len(key) <= MAX_KEY_CHARS:
        raise BadRequest(f"{REQUEST_KEY_HEADER} must have 1 to {MAX_KEY_CHARS} characters")
    return key


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    world = request.app[REPLICA].world
    card = {
        "id": world.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "sessiongen-sim",
        "root": world.model_name,
        "parent": None,
        "max_model_len": world.profile.max_model_len,
    }
    return _json({"object": "list", "data": [card]})


async def version(request: web.Request) -> web.Response:
    """What the replica is: simulated, and its time scale (wall seconds per modeled
    second), so that a replay against it as endpoints reports modeled seconds."""
    replica = request.app[REPLICA]
    return _json(
        {
            "version": f"sessiongen-sim {__version__}",
            "server": "sessiongen simulator (a timing model, not a model server)",
            "sessiongen": __version__,
            "simulated": True,
            "time_scale": replica.world.time_scale,
            "replica": replica.index,
        }
    )


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize``: ``prompt`` or ``messages`` in, count and ids out."""
    world = request.app[REPLICA].world
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return bad_request(BadRequest(f"malformed JSON: {exc}"))
    if not isinstance(body, dict):
        return bad_request(BadRequest("request body must be a JSON object"))
    model = body.get("model")
    if model is not None and model != world.model_name:
        return bad_request(BadRequest(f"The model `{model}` does not exist.", "model"))
    loop = asyncio.get_running_loop()
    try:
        ids = await loop.run_in_executor(None, _tokenize_body, world, body)
    except BadRequest as exc:
        return bad_request(exc)
    return _json({"count": len(ids), "max_model_len": world.profile.max_model_len, "tokens": ids})


def _tokenize_body(world: World, body: dict[str, Any]) -> list[int]:
    if "messages" in body:
        req = parse_generation({**body, "model": world.model_name}, "chat")
        add = body.get("add_generation_prompt", True)
        ids = world.tokenizer.chat(req.messages, add_generation_prompt=bool(add))
    else:
        req = parse_generation({**body, "model": world.model_name}, "completions")
        ids = world.prompt_ids(req)
    tokens: list[int] = ids.tolist()
    return tokens


async def metrics(request: web.Request) -> web.Response:
    body = request.app[REPLICA].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def sim_reset(request: web.Request) -> web.Response:
    """Drop this replica's prefix cache; ``{"pool": true}`` also empties the shared pool."""
    try:
        body = await _json_body(request)
    except BadRequest as exc:
        return bad_request(exc)
    pool = body.get("pool", False)
    if not isinstance(pool, bool):
        return bad_request(BadRequest("pool must be true or false", "pool"))
    replica = request.app[REPLICA]
    replica.reset(pool)
    return _json({"replica": replica.index, "local_cleared": True, "pool_cleared": pool})


async def sim_config(request: web.Request) -> web.Response:
    """Read (GET) or change (POST) the pool switch and the time scale of all replicas."""
    world = request.app[REPLICA].world
    if request.method == "POST":
        try:
            body = await _json_body(request)
            shared, scale = body.get("shared_cache"), body.get("time_scale")
            unknown = sorted(set(body) - {"shared_cache", "time_scale"})
            if unknown:
                raise BadRequest(f"unknown key {unknown[0]!r}", unknown[0])
            if shared is not None and not isinstance(shared, bool):
                raise BadRequest("shared_cache must be true or false", "shared_cache")
            if scale is not None and (
                isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0
            ):
                raise BadRequest("time_scale must be a number > 0", "time_scale")
        except BadRequest as exc:
            return bad_request(exc)
        world.configure(shared, float(scale) if scale is not None else None)
    now = world.modeled(asyncio.get_running_loop().time())
    clock = f"{os.getpid()}-{id(world)}"
    return _json({**world.config(), "modeled_now_s": max(now, 0.0), "clock": clock})


async def _stop_world(app: web.Application) -> None:
    await app[REPLICA].world.stop()


def build_app(replica: Replica) -> web.Application:
    """The aiohttp app of one replica."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[REPLICA] = replica
    app.on_cleanup.append(_stop_world)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/sim/reset", sim_reset)
    app.router.add_route("*", "/sim/config", sim_config)
    return app


def make_apps(
    profile: SimProfile, model_name: str, shared_cache: bool, *, engine: Engine = "auto"
) -> list[web.Application]:
    """One app per replica of a fresh simulated world (in-process use, e.g. tests), on
    ``engine`` (:mod:`sessiongen.sim.compiled`)."""
    world = World(profile, model_name, shared_cache, engine=engine)
    return [build_app(replica) for replica in world.replicas]
