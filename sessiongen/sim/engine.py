"""The simulated replicas' engine: request preparation, the prefill slot, the schedule.

A :class:`World` is everything the replicas of one process share (profile, shared pool,
the pool switch, the time scale, the tokenizer); a :class:`Replica` has its own prefix
cache, its single prefill slot and its metrics.

Time: modeled seconds times ``time_scale`` are wall seconds. Every deadline is computed
from the request's *arrival* (``loop.time()`` at handler entry) and from the replica's
virtual schedule, never from when the simulator got round to it, so its own work
(JSON parsing, tokenizing, hashing, which run in worker threads) is absorbed instead of
added, and timer lateness never accumulates from one request to the next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import output
from sessiongen.sim.cache import LocalPrefixCache, SharedPool, chain_keys, split_hit
from sessiongen.sim.metrics import ReplicaMetrics
from sessiongen.sim.model import Timing, request_timing
from sessiongen.sim.prompt import PromptTokenizer
from sessiongen.sim.wire import Api, BadRequest, GenRequest, parse_generation
from sessiongen.workload.probes import answer_needle

log = logging.getLogger("sessiongen.sim")


@dataclass(frozen=True)
class Job:
    """A parsed, tokenized and hashed request, ready to be scheduled."""

    req: GenRequest
    prompt_tokens: int
    max_tokens: int
    local_keys: list[int]
    pool_keys: list[int]
    digest: str
    answer: str | None


@dataclass(frozen=True)
class Admission:
    """Where a request landed in its replica's schedule (loop-clock times, wall seconds)."""

    local_hit: int
    pool_hit: int
    timing: Timing
    arrival: float
    start: float
    first_token_at: float
    time_scale: float

    @property
    def cached(self) -> int:
        return self.local_hit + self.pool_hit

    @property
    def modeled_queue_s(self) -> float:
        return (self.start - self.arrival) / self.time_scale

    @property
    def modeled_ttft_s(self) -> float:
        return (self.first_token_at - self.arrival) / self.time_scale


class World:
    """The state shared by all replicas of one simulator process."""

    def __init__(self, profile: SimProfile, model_name: str, shared_cache: bool) -> None:
        self.profile = profile
        self.model_name = model_name
        self.shared_cache = shared_cache
        self.time_scale = profile.time_scale
        pool_bytes = int(profile.pool_capacity_gib * 2**30)
        self.pool = SharedPool(pool_bytes, profile.pool_chunk_tokens, profile.kv_bytes_per_token)
        self.tokenizer = PromptTokenizer()
        output.word_ids()  # built once here, not inside the first request
        self.replicas = [Replica(self, i) for i in range(profile.replicas)]

    def configure(self, shared_cache: bool | None = None, time_scale: float | None = None) -> None:
        """Switch the pool on or off and/or change the time scale (for idle replicas)."""
        if shared_cache is not None:
            self.shared_cache = shared_cache
        if time_scale is not None:
            self.time_scale = time_scale
        for replica in self.replicas:
            replica.metrics.set_info(self.time_scale, self.shared_cache)

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
        return Job(
            req=req,
            prompt_tokens=n,
            max_tokens=max_tokens,
            local_keys=chain_keys(ids, self.profile.local_block_tokens),
            pool_keys=chain_keys(ids, self.profile.pool_chunk_tokens),
            digest=output.prompt_digest(ids),
            answer=self._needle_answer(req),
        )

    def _needle_answer(self, req: GenRequest) -> str | None:
        if req.api == "chat":
            if req.messages[-1][0] != "user":
                return None
            return answer_needle("\n".join(content for _role, content in req.messages))
        return answer_needle(req.prompt_text) if req.prompt_text is not None else None

    def complete(self, job: Job, adm: Admission) -> output.Output:
        """The request's output (runs in a worker thread while the prefill is modeled)."""
        req = job.req
        corrupted = output.is_corrupted(job.digest, adm.pool_hit, self.profile.pool_corruption)
        if corrupted:
            log.info("corrupted output (planted pool fault) for prompt %s", job.digest[:12])
        return output.generate(
            job.digest,
            output.sampling_key(req.temperature, req.seed),
            job.max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            answer=job.answer,
            corrupted=corrupted,
            top_k=max(req.top_logprobs, 1) if req.logprobs else 0,
        )

    def config(self) -> dict[str, Any]:
        """The current configuration, as ``GET /sim/config`` reports it."""
        return {
            "shared_cache": self.shared_cache,
            "time_scale": self.time_scale,
            "replicas": len(self.replicas),
            "model": self.model_name,
            "profile": to_plain(self.profile),
        }


class Replica:
    """One simulated GPU replica: a prefix cache, one prefill slot, interleaved decodes."""

    def __init__(self, world: World, index: int) -> None:
        self.world = world
        self.index = index
        p = world.profile
        self.cache = LocalPrefixCache(p.local_cache_tokens, p.local_block_tokens)
        self.metrics = ReplicaMetrics(world.model_name, index)
        # vLLM's "running" excludes requests still queued for the prefill slot.
        self.metrics.watch(lambda: self.running - self.waiting, lambda: self.waiting)
        self.metrics.set_info(world.time_scale, world.shared_cache)
        self._slot = asyncio.Lock()
        self._free_at = 0.0
        self.running = 0
        self.waiting = 0
        self.decoding = 0

    @contextmanager
    def active(self) -> Iterator[None]:
        """Count a request as admitted (queued for the slot, prefilling or decoding)."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1

    @contextmanager
    def decode(self) -> Iterator[None]:
        """Count a request in the decode batch while the block runs."""
        self.decoding += 1
        try:
            yield
        finally:
            self.decoding -= 1

    async def admit(self, job: Job, arrival: float) -> Admission:
        """Take the prefill slot in turn, look up the caches and model the prefill.

        The slot stays taken until the modeled prefill ends; the prompt's blocks (and its
        chunks, when the pool is on) become visible to lookups then. Returns at once with
        the schedule; the caller waits for ``first_token_at``.
        """
        loop = asyncio.get_running_loop()
        world = self.world
        self.waiting += 1
        try:
            await self._slot.acquire()
        finally:
            self.waiting -= 1
        scale = world.time_scale
        start = max(arrival, self._free_at)
        limit = job.prompt_tokens - 1
        pool_on = world.shared_cache
        pool_prefix = world.pool.lookup(job.pool_keys, limit, start) if pool_on else 0
        local, pool_hit = split_hit(self.cache.lookup(job.local_keys, limit), pool_prefix)
        timing = request_timing(
            world.profile, job.prompt_tokens, local, pool_hit, running=self.decoding + 1
        )
        prefill_end = start + timing.busy_s * scale
        self._free_at = prefill_end
        # Store now, while the request's own deadline still absorbs the work; the slot
        # (and the pool's visibility time) keep the entries unseen until prefill_end.
        self.cache.insert(job.local_keys)
        if pool_on:
            world.pool.insert(job.pool_keys, visible_at=prefill_end)
        loop.call_at(prefill_end, self._slot.release)
        self.metrics.record(job.prompt_tokens, local, pool_hit, pool_on)
        adm = Admission(
            local_hit=local,
            pool_hit=pool_hit,
            timing=timing,
            arrival=arrival,
            start=start,
            first_token_at=prefill_end + timing.first_token_s * scale,
            time_scale=scale,
        )
        self.metrics.ttft.observe(adm.modeled_ttft_s)
        return adm

    def reset(self, pool: bool) -> None:
        """Drop this replica's prefix cache (and the shared pool if ``pool``)."""
        self.cache.clear()
        if pool:
            self.world.pool.clear()
