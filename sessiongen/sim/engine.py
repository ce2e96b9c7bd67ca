"""The served simulator's engine: request preparation, and the scheduler in wall time.

A :class:`World` is everything the replicas of one process share: the profile, the
tokenizer, the time scale and one :class:`~sessiongen.sim.cluster.Cluster` (every
replica's vLLM scheduler and the shared pool), driven by one task on the event loop.
A :class:`Replica` is one replica's face to its HTTP app: its metrics and its reset.

The engine is the compiled one where it was built, else the Python one
(:mod:`sessiongen.sim.compiled`; ``SESSIONGEN_ENGINE`` or ``engine=`` force one): both
hear the same arrivals and give the same modeled times to the bit
(``tests/unit/sim/test_served_engines.py``); the compiled one takes less of the event
loop's time per step, which every HTTP handler shares (``bench/served_rate.py`` measures
the rate one process sustains).

Time: modeled seconds times ``time_scale`` are wall seconds, counted from the world's
epoch on the loop clock. A request arrives at the modeled time of its handler's entry
and is submitted once parsed, tokenized and hashed (in a worker thread); the engine
schedules it from its arrival, so that work is absorbed, not added. The driver task
sleeps until the wall time of the next step boundary and then processes every event
due; a request's first-token time is known when the step that samples it is formed,
one step ahead, and its handler sleeps until exactly that time to write it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import orjson
from numpy.typing import NDArray

from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import output
from sessiongen.sim.cache import PromptKeys
from sessiongen.sim.cluster import Cluster
from sessiongen.sim.compiled import Engine, core, resolve
from sessiongen.sim.noise import PrefillNoise
from sessiongen.sim.prompt import PromptTokenizer
from sessiongen.sim.scheduler import SimRequest, Step
from sessiongen.sim.wire import Api, BadRequest, GenRequest, parse_generation
from sessiongen.text.probes import answer_needle

if TYPE_CHECKING:  # built by pip install; absent where no compiler was at hand
    import asyncio

    from sessiongen.sim._core import Cluster as CompiledCluster
    from sessiongen.sim._core import _Req as CompiledRequest
    from sessiongen.sim._core import _Step as CompiledStep
    from sessiongen.sim.metrics import ReplicaMetrics

log = logging.getLogger("sessiongen.sim")

# The compiled engine takes a request's keys in two pieces (a shared head, then its
# own); the served one's are one array, its own.
_NO_HEAD: NDArray[np.uint64] = np.empty(0, dtype=np.uint64)


@dataclass(frozen=True)
class Job:
    """A parsed, tokenized and hashed request, ready to be scheduled.

    ``output`` is generated while preparing, unless it depends on the admission (a
    planted pool fault would corrupt this prompt if any of it came from the pool);
    ``keys`` then cover the output too, so its blocks are cached however fast the
    modeled decode runs.
    """

    req: GenRequest
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    sampling_key: int
    keys: PromptKeys
    local_keys: NDArray[np.uint64]
    digest: str
    answer: str | None
    output: output.Output | None


class Served:
    """One request in the served simulator: the engine's request and what it learns.

    The engine fills ``token_times`` (modeled seconds of each output token, known one
    step ahead) and resolves the waits; times are turned into wall deadlines by the
    handler. ``sim`` is the engine's request (either engine's: the same account).
    """

    def __init__(self, world: World, replica: int, job: Job, arrival: float) -> None:
        self.world = world
        self.replica = replica
        self.job = job
        self.arrival_wall = arrival
        loop = _asyncio().get_running_loop()
        self.admitted: asyncio.Future[None] = loop.create_future()
        self.token_times: list[float] = []
        self._waiter: asyncio.Future[None] | None = None
        self.sim: SimRequest | CompiledRequest

    @property
    def finished(self) -> bool:
        return self.sim.finished_at is not None

    def notify(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_tokens(self, count: int) -> None:
        """Until the times of the first ``count`` tokens are known."""
        while len(self.token_times) < count:
            self._waiter = _asyncio().get_running_loop().create_future()
            await self._waiter

    async def wait_finished(self) -> None:
        """Until the engine has scheduled the request's last token."""
        await self.wait_tokens(self.sim.output_tokens)

    def facts(self) -> dict[str, Any]:
        """The engine's account of the request (modeled seconds, blocks)."""
        sim = self.sim
        assert sim.admitted_at is not None and sim.first_token_at is not None
        facts: dict[str, Any] = {
            "replica": self.replica,
            "local_hit_tokens": sim.local_hit,
            "pool_hit_tokens": sim.pool_hit,
            "modeled_ttft_s": sim.first_token_at - sim.arrival,
            "modeled_queue_s": sim.admitted_at - sim.arrival,
            "preemptions": sim.preemptions,
            "kv_blocks_in_use_at_admission": sim.kv_blocks_at_admission,
            "kv_blocks_total": self.world.cluster.replicas[self.replica].kv.capacity,
            "running_at_admission": sim.running_at_admission,
            "waiting_at_admission": sim.waiting_at_admission,
        }
        if len(self.token_times) == sim.output_tokens:
            facts["modeled_e2e_s"] = self.token_times[-1] - sim.arrival
        return facts


class World:
    """The state shared by all replicas of one simulator process."""

    def __init__(
        self, profile: SimProfile, model_name: str, shared_cache: bool, *, engine: Engine = "auto"
    ) -> None:
        self.profile = profile
        self.model_name = model_name
        self.time_scale = profile.time_scale
        self.engine = resolve(engine)
        self.cluster: Cluster | CompiledCluster
        module = core()
        if self.engine == "compiled" and module is not None:
            self.cluster = module.Cluster(
                profile, shared_cache=shared_cache, collapse=False, listener=self
            )
        else:
            self.cluster = Cluster(profile, shared_cache=shared_cache, listener=self)
        # Service-time noise: by the request's stated key, else in the order of arrival.
        self.noise = PrefillNoise(profile.prefill_noise_sigma, 0)
        self.tokenizer = PromptTokenizer()
        output.word_ids()  # built once here, not inside the first request
        self.streams = 0  # responses streaming their decode tokens now
        self.late_warned_at = float("-inf")  # monotonic time of the last lateness warning
        self._epoch: float | None = None
        self._driver: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None

    @functools.cached_property
    def replicas(self) -> list[Replica]:
        """Each replica's face to its HTTP app (its metrics), made when first asked for:
        the planner's World serves nothing, and prometheus_client is 15 ms to import."""
        return [Replica(self, i) for i in range(self.profile.replicas)]

    @property
    def shared_cache(self) -> bool:
        return self.cluster.pool.on

    # --- the clock ----------------------------------------------------------------------

    def _loop_epoch(self) -> float:
        if self._epoch is None:
            self._epoch = _asyncio().get_running_loop().time()
        return self._epoch

    def modeled(self, wall: float) -> float:
        """Modeled seconds at loop time ``wall``."""
        return (wall - self._loop_epoch()) / self.time_scale

    def wall(self, modeled: float) -> float:
        """Loop time at modeled time ``modeled``."""
        return self._loop_epoch() + modeled * self.time_scale

    def configure(self, shared_cache: bool | None = None, time_scale: float | None = None) -> None:
        """Switch the pool on or off and/or change the time scale (for idle replicas).

        A new time scale keeps the modeled clock continuous: modeled "now" stays put.
        """
        if shared_cache is not None:
            self.cluster.pool.on = shared_cache
        if time_scale is not None and time_scale != self.time_scale:
            if self._epoch is not None:
                now = _asyncio().get_running_loop().time()
                modeled_now = self.modeled(now)
                self._epoch = now - modeled_now * time_scale
            self.time_scale = time_scale
        for replica in self.replicas:
            replica.metrics.set_info(self.time_scale, self.shared_cache)

    # --- requests -----------------------------------------------------------------------

    def prompt_ids(self, req: GenRequest) -> NDArray[np.uint32]:
        """A request's prompt token ids (chat template applied)."""
        if req.api == "chat":
            return self.tokenizer.chat(req.messages)
        if req.prompt_ids is not None:
            return req.prompt_ids
        return self.tokenizer.encode(req.prompt_text or "")

    def prepare(self, raw: bytes, api: Api) -> Job:
        """Parse, validate, tokenize and hash a request body. Runs in a worker thread."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"malformed JSON: {exc}") from None
        req = parse_generation(body, api)
        if req.model != self.model_name:
            raise BadRequest(f"The model `{req.model}` does not exist.", "model")
        ids = self.prompt_ids(req)
        n, limit = len(ids), self.profile.max_model_len
        if n == 0:
            raise BadRequest(
                "the prompt is empty", "prompt" if api == "completions" else "messages"
            )
        max_tokens = req.max_tokens if req.max_tokens is not None else limit - n
        if n + max_tokens > limit or max_tokens < 1:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} in the "
                "completion). Please reduce the length of the prompt or completion.",
                "max_tokens" if req.max_tokens is not None else None,
            )
        digest = output.prompt_digest(ids)
        key = output.sampling_key(req.temperature, req.seed)
        p = self.profile
        keys = PromptKeys.of(ids, p.local_block_tokens, p.pool_chunk_tokens)
        job = Job(
            req=req,
            prompt_tokens=n,
            max_tokens=max_tokens,
            output_tokens=output.output_length(
                digest, key, max_tokens, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos
            ),
            sampling_key=key,
            keys=keys,
            local_keys=keys.local.keys,
            digest=digest,
            answer=self._needle_answer(req),
            output=None,
        )
        if output.is_corrupted(digest, 1, p.pool_corruption):
            return job  # the output waits for the admission's pool hit
        out, local_keys = self.complete(job, pool_hit=0)
        return dataclasses.replace(job, output=out, local_keys=local_keys)

    def _needle_answer(self, req: GenRequest) -> str | None:
        if req.api == "chat":
            if req.messages[-1][0] != "user":
                return None
            return answer_needle("\n".join(content for _role, content in req.messages))
        return answer_needle(req.prompt_text) if req.prompt_text is not None else None

    def complete(self, job: Job, pool_hit: int) -> tuple[output.Output, NDArray[np.uint64]]:
        """The request's output and the KV block keys of prompt plus output.

        Runs in a worker thread; the keys let the answer's full blocks be cached, as
        vLLM caches blocks of generated tokens.
        """
        req = job.req
        corrupted = output.is_corrupted(job.digest, pool_hit, self.profile.pool_corruption)
        if corrupted:
            log.info("corrupted output (planted pool fault) for prompt %s", job.digest[:12])
        out = output.generate(
            job.digest,
            job.sampling_key,
            job.max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            answer=job.answer,
            corrupted=corrupted,
            top_k=max(req.top_logprobs, 1) if req.logprobs else 0,
        )
        return out, job.keys.local.extend(out.ids).keys

    def submit(
        self,
        job: Job,
        replica: int,
        arrival: float,
        modeled_arrival: float | None = None,
        noise_key: str | None = None,
    ) -> Served:
        """Hand a prepared request to the engine (arrival: loop time at handler entry).

        ``modeled_arrival`` (modeled seconds), where the client states it, is the
        request's arrival instead of the handler's entry on the wall clock;
        ``noise_key``, where it states one, draws its service-time noise
        (:mod:`sessiongen.sim.noise`).
        """
        served = Served(self, replica, job, arrival)
        at = self.modeled(arrival) if modeled_arrival is None else modeled_arrival
        scale = self.noise.factor(noise_key)
        cluster = self.cluster
        if isinstance(cluster, Cluster):
            sim = SimRequest(
                prompt_tokens=job.prompt_tokens,
                output_tokens=job.output_tokens,
                keys=job.local_keys,
                pool_keys=job.keys.pool.keys.tolist(),
                arrival=at,
                tag=served,
                prefill_scale=scale,
            )
            cluster.submit(sim, replica)
            served.sim = sim
        else:
            pool_keys = np.ascontiguousarray(job.keys.pool.keys)
            served.sim = cluster.submit(
                at, replica, job.prompt_tokens, job.output_tokens, _NO_HEAD,
                np.ascontiguousarray(job.local_keys), pool_keys, served, scale,
            )  # fmt: skip
        self._ensure_driver()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        return served

    def abort(self, served: Served) -> None:
        """The client went away before the end: free what the request holds."""
        if served.finished:
            return
        if isinstance(self.cluster, Cluster):
            self.cluster.abort(cast(SimRequest, served.sim), served.replica)
        else:
            self.cluster.abort(cast("CompiledRequest", served.sim), served.replica)

    # --- the driver ---------------------------------------------------------------------

    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._driver = _asyncio().get_running_loop().create_task(self._drive())
            self._driver.add_done_callback(_driver_done)

    async def stop(self) -> None:
        """Stop the driver task (on app cleanup)."""
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(_asyncio().CancelledError):
                await self._driver
            self._driver = None

    async def _drive(self) -> None:
        """Process the engine's events as the wall clock reaches them."""
        loop = _asyncio().get_running_loop()
        cluster = self.cluster
        while True:
            t = cluster.next_time()
            now = loop.time()
            if t is not None and self.wall(t) <= now:
                cluster.advance(max(t, self.modeled(now)))
                continue
            wake: asyncio.Future[None] = loop.create_future()
            self._wake = wake
            timer = loop.call_at(self.wall(t), _resolve, wake) if t is not None else None
            try:
                await wake
            finally:
                self._wake = None
                if timer is not None:
                    timer.cancel()

    # --- the engine's listener ----------------------------------------------------------

    def step_started(self, replica: int, step: Step | CompiledStep) -> None:
        metrics = self.replicas[replica].metrics
        pool_on = self.shared_cache
        for req in step.admitted:
            served: Served = req.tag
            if not served.admitted.done():
                metrics.record(req.prompt_tokens, req.local_hit, req.pool_hit, pool_on)
                served.admitted.set_result(None)
        if step.preempted:
            metrics.preemptions.inc(len(step.preempted))
        for req in step.sampled:
            served = req.tag
            served.token_times.append(step.end)
            if len(served.token_times) == 1:
                metrics.ttft.observe(step.end - req.arrival)
            served.notify()

    def step_ended(self, replica: int, step: Step | CompiledStep) -> None:
        return None

    def config(self) -> dict[str, Any]:
        """The current configuration, as ``GET /sim/config`` reports it."""
        return {
            "shared_cache": self.shared_cache,
            "time_scale": self.time_scale,
            "engine": self.engine,
            "replicas": len(self.replicas),
            "model": self.model_name,
            "profile": to_plain(self.profile),
        }


@functools.cache
def _asyncio() -> ModuleType:
    """asyncio, imported when the served simulator first needs it: the planner makes a
    World for its prompts and never runs a loop (asyncio and ssl are 13 ms of a plan)."""
    import asyncio

    return asyncio


def _driver_done(task: asyncio.Task[None]) -> None:
    """A driver that fails leaves its requests waiting: say so, with the traceback."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the simulator's engine failed", exc_info=task.exception())


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Replica:
    """One simulated replica as its HTTP app sees it: metrics, reset."""

    def __init__(self, world: World, index: int) -> None:
        self.world = world
        self.index = index
        from sessiongen.sim.metrics import ReplicaMetrics  # prometheus_client: served only

        self.scheduler = world.cluster.replicas[index]
        self.metrics: ReplicaMetrics = ReplicaMetrics(world.model_name, index)
        sched = self.scheduler
        self.metrics.watch(
            lambda: len(sched.running),
            lambda: len(sched.waiting) + len(sched.loading),
            lambda: sched.kv.usage,
        )
        self.metrics.set_info(world.time_scale, world.shared_cache)

    def reset(self, pool: bool) -> None:
        """Drop this replica's cached KV blocks (and the shared pool if ``pool``)."""
        self.scheduler.reset_cache()
        if pool:
            self.world.cluster.pool.clear()
