"""vLLM V1's scheduler for one simulated replica: a state machine that knows no clock.

The caller hands it times; it never reads a clock, sleeps or awaits, so the served
simulator (wall time) and the capacity planner (virtual time) run the same code.

One engine step (``Scheduler.schedule`` in vllm/v1/core/sched/scheduler.py):

1. A token budget of ``max_num_batched_tokens``.
2. Running requests first, in admission order: each gets what it still lacks (one token
   for a decode, the rest of its prompt for a chunked prefill), capped by the budget.
   When its new KV blocks cannot be allocated, the most recently admitted running
   request is preempted (recompute: its blocks are freed, still cached, and it goes to
   the head of the waiting queue), until the allocation fits or the request itself was
   the one preempted.
3. Then, only if nobody was preempted, the waiting queue in order (FCFS) while budget is
   left and fewer than ``max_num_seqs`` run: a request's prefix is looked up in the
   replica's KV cache and then the pool beyond it (hits capped at all tokens but the
   last, block- and chunk-aligned); its first chunk is whatever budget is left; if its
   blocks cannot be allocated the queue stops there (head-of-line blocking).
4. A request whose scheduled tokens reach all its tokens samples one at the step's end.

The step's duration (:mod:`sessiongen.sim.model`): the hit overheads of the requests
admitted in it, the wait for their pool loads (over the pool's FIFO link), the prefill
of every chunk, storing the computed KV in the pool (pool on), and one decode part for
all sequences that sample.

Pool loads are synchronous by default (``pool_load_mode = "sync"``: the admitting step
waits for them, and so does everybody in its batch). Asynchronous (``"async"``, vLLM's
``WAITING_FOR_REMOTE_KVS``): a request with a pool hit is admitted (blocks allocated,
hits counted, hit overhead paid) but waits apart until its load ends, then joins the
running batch at the next step that starts at or after that; the steps meanwhile do not
wait, and none is collapsed into a run while a load is pending. State changes when a
step is scheduled (as vLLM's ``_update_after_schedule``); what the step makes visible
to others (full KV blocks for lookups, chunks in the pool) appears at its end
(:meth:`ReplicaScheduler.complete`).

A steady step can stand for the run of identical steps that follows it
(:meth:`ReplicaScheduler.extend`): decodes, and at most one long prompt taking the rest
of each step's budget in chunks. Nothing changes in such a run but contexts growing,
which changes step durations linearly, until a request finishes, the prompt is
complete or the KV cache runs short, so the virtual clock jumps to its end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.cache import split_hit
from sessiongen.sim.kvcache import KVCache, KVHold
from sessiongen.sim.pool import Pool
from sessiongen.sim.timing import (
    boundary,
    decode_step_s,
    hit_overhead_s,
    pool_store_s,
    prefill_s,
    run_delta,
    steps_reaching,
)


class SimRequest:
    """One request inside the engine. Mutable; the scheduler owns its state fields.

    ``keys`` are the KV block keys of its tokens as far as they are known (the prompt's,
    and the output's once known: :meth:`set_keys`); ``pool_keys`` the prompt's chunks.
    Times are on the caller's clock (modeled seconds).
    """

    __slots__ = (
        "aborted",
        "admitted_at",
        "arrival",
        "computed",
        "finished_at",
        "first_token_at",
        "generated",
        "hold",
        "keys",
        "kv_blocks_at_admission",
        "local_hit",
        "output_tokens",
        "pool_hit",
        "pool_keys",
        "pool_stored",
        "preemptions",
        "prefill_scale",
        "prefilling",
        "prompt_tokens",
        "ready_at",
        "running_at_admission",
        "tag",
        "waiting_at_admission",
    )

    def __init__(
        self,
        *,
        prompt_tokens: int,
        output_tokens: int,
        keys: NDArray[np.uint64],
        pool_keys: Sequence[int],
        arrival: float,
        tag: Any = None,
        prefill_scale: float = 1.0,
    ) -> None:
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.keys = keys
        self.pool_keys = pool_keys
        self.arrival = arrival
        self.tag = tag
        # Multiplies its prefill compute: the service-time noise the driver draws
        # (SimProfile.prefill_noise_sigma; 1.0 leaves every time as it was, exactly).
        self.prefill_scale = prefill_scale
        self.computed = 0  # vLLM's num_computed_tokens
        self.generated = 0  # output tokens sampled so far
        self.prefilling = True  # computing a prompt (or recomputing after preemption)
        self.hold: KVHold | None = None
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.local_hit = 0
        self.pool_hit = 0
        self.preemptions = 0
        self.kv_blocks_at_admission = 0
        self.running_at_admission = 0
        self.waiting_at_admission = 0
        self.pool_stored = 0  # prompt chunks stored in the pool so far (-1: all, refreshed)
        self.ready_at = 0.0  # asynchronous pool load: when its KV is in
        self.aborted = False

    @property
    def num_tokens(self) -> int:
        """Prompt plus the output sampled so far (what a resumed request recomputes)."""
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens

    def set_keys(self, keys: NDArray[np.uint64]) -> None:
        """Longer keys for the same tokens (e.g. once the output is known)."""
        if len(keys) > len(self.keys):
            self.keys = keys


class Step:
    """One engine step of one replica (or, with ``count > 1``, a run of decode steps)."""

    __slots__ = (
        "admitted",
        "count",
        "delta",
        "duration",
        "end",
        "finished",
        "open",
        "partial",
        "parts",
        "preempted",
        "sampled",
        "start",
        "steady",
        "work",
    )

    def __init__(self, start: float) -> None:
        self.start = start
        self.duration = 0.0  # of the first step
        self.end = start
        self.count = 1
        self.delta = 0.0  # growth of each further step's duration (a run of decodes)
        self.work: list[tuple[SimRequest, int]] = []  # (request, tokens scheduled)
        self.admitted: list[SimRequest] = []
        self.preempted: list[SimRequest] = []
        self.sampled: list[SimRequest] = []  # sample a token at the end of the first step
        self.finished: list[SimRequest] = []  # filled by ReplicaScheduler.complete
        # Whether the steps after this one repeat it (see ReplicaScheduler.extend): only
        # decodes, and at most one prompt part-way through its prefill (``partial``),
        # which then takes all the budget that is left.
        self.steady = False
        self.partial: SimRequest | None = None
        # Whether an arrival could be admitted at the next boundary (an empty waiting
        # queue and budget left): only then does an arrival cut a run short.
        self.open = False
        # overhead, load wait, prefill, store, decode (modeled s)
        self.parts: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)

    def boundary(self, steps: int) -> float:
        """When the first ``steps`` steps of the run end."""
        return boundary(self.start, self.duration, self.delta, steps)


class ReplicaScheduler:
    """One replica's waiting queue, running batch and KV cache (see the module doc)."""

    def __init__(self, profile: SimProfile, index: int, pool: Pool) -> None:
        self.profile = profile
        self.params = pool.params  # the profile's numbers, read once for all replicas
        self.index = index
        self.pool = pool
        block = profile.local_block_tokens
        self.kv = KVCache(profile.local_cache_tokens // block, block)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.loading: list[SimRequest] = []  # admitted, waiting for an asynchronous load
        self.async_loads = profile.pool_load_mode == "async"
        self.preemptions = 0
        self.steps = 0

    def add(self, req: SimRequest) -> None:
        """A new request joins the back of the waiting queue."""
        if self.kv.blocks_for(req.prompt_tokens + req.output_tokens) > self.kv.capacity:
            raise ValueError(
                f"request of {req.prompt_tokens + req.output_tokens} tokens cannot fit in "
                f"a KV cache of {self.kv.capacity * self.kv.block_tokens} tokens"
            )
        self.waiting.append(req)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and not self.loading

    def next_ready(self) -> float | None:
        """When the first pending asynchronous load ends (None: none pending)."""
        return min((r.ready_at for r in self.loading), default=None)

    def _take_loaded(self, now: float) -> None:
        """Requests whose asynchronous loads have ended join the running batch, in the
        order their loads end."""
        ready = sorted((r for r in self.loading if r.ready_at <= now), key=lambda r: r.ready_at)
        if ready:
            self.loading = [r for r in self.loading if r.ready_at > now]
            self.running.extend(ready)

    # --- scheduling -------------------------------------------------------------------

    def schedule(self, now: float) -> Step | None:
        """Form the step that starts at ``now`` (None when there is nothing to do)."""
        if self.loading:
            self._take_loaded(now)
        if not self.running and not self.waiting:
            return None
        step = Step(now)
        p = self.params
        budget = p.max_num_batched_tokens
        if self.running:
            budget = self._schedule_running(step, budget)
        overhead, load_done = 0.0, now
        if self.waiting and not step.preempted:
            overhead, load_done, budget = self._schedule_waiting(step, budget, now)
        if not step.work and not step.admitted:
            if step.preempted:
                # Every running request was preempted (the last for its own blocks) and
                # nothing was scheduled: vLLM's engine loop schedules again at once, now
                # from the waiting queue, where they went. Returning None here left the
                # replica idle with requests waiting and nothing to wake it.
                return self.schedule(now)
            return None  # the queue's head waits for blocks that pending loads hold
        prefill, seqs, context = 0.0, 0, 0
        prefills, prompt_done, stored = 0, False, 0
        sampled, first = step.sampled, []
        for req, n in step.work:
            computed, prefilling = req.computed, req.prefilling
            if prefilling:
                prefill += prefill_s(p, n, computed) * req.prefill_scale
                prefills += 1
                stored += n
            computed += n
            req.computed = computed
            if computed == req.prompt_tokens + req.generated:
                seqs += 1
                context += computed
                sampled.append(req)
                req.generated += 1
                if prefilling:
                    prompt_done = True
                    req.prefilling = False
                    if req.first_token_at is None:
                        first.append(req)
            elif prefilling:
                step.partial = req
        step.steady = (
            not step.admitted
            and not step.preempted
            and not prompt_done
            and prefills <= 1
            and not self.loading
        )
        step.open = (
            step.partial is None
            and budget > 0
            and not self.waiting
            and len(self.running) < p.max_num_seqs
        )
        decode = decode_step_s(p, seqs, context)
        load = load_done - now
        store = pool_store_s(p, stored) if stored and self.pool.on else 0.0
        step.parts = (overhead, load, prefill, store, decode)
        step.duration = overhead + load + prefill + store + decode
        step.end = now + step.duration
        for req in first:
            req.first_token_at = step.end
        self.steps += 1
        return step

    def _schedule_running(self, step: Step, budget: int) -> int:
        kv, running, work = self.kv, self.running, step.work
        block = kv.block_tokens
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            hold = req.hold
            assert hold is not None
            computed = req.computed
            n = req.prompt_tokens + req.generated - computed
            if n > budget:
                n = budget
            need = -(-(computed + n) // block) - hold.logical
            if need > 0:
                while not kv.grow(hold, need):
                    victim = running.pop()
                    self._preempt(victim)
                    step.preempted.append(victim)
                    if victim is req:
                        return budget
            work.append((req, n))
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, step: Step, budget: int, now: float) -> tuple[float, float, int]:
        kv, p = self.kv, self.params
        block = kv.block_tokens
        overhead, load_done = 0.0, now
        most = p.max_num_seqs
        while self.waiting and budget > 0 and len(self.running) + len(self.loading) < most:
            req = self.waiting[0]
            limit = req.num_tokens - 1  # the last token is always computed
            match = kv.match(req.keys, limit // block)
            local = match.blocks * block
            pool_prefix = self.pool.lookup(req.pool_keys, limit, now, beyond=local)
            local, external = split_hit(local, pool_prefix)
            computed = local + external
            n = min(req.num_tokens - computed, budget)
            need = kv.blocks_for(computed + n) - match.blocks
            if need > kv.available_blocks - match.free_blocks:
                break  # head-of-line blocking: nobody behind it is admitted either
            self.waiting.popleft()
            used_before = kv.used_blocks
            req.hold = kv.new_hold()
            kv.acquire(req.hold, match)
            granted = kv.grow(req.hold, need)
            assert granted
            req.computed = computed
            req.prefilling = True
            overhead += hit_overhead_s(p, local)
            loads_apart = False
            if external:
                done = self.pool.load(now, external)
                loads_apart = self.async_loads
                if loads_apart:
                    req.ready_at = done
                else:
                    load_done = max(load_done, done)
            if req.admitted_at is None:  # vLLM reports the first admission's hits
                req.admitted_at = now
                req.local_hit, req.pool_hit = local, external
                req.kv_blocks_at_admission = used_before
                req.running_at_admission = len(self.running)
                req.waiting_at_admission = len(self.waiting)
            step.admitted.append(req)
            if loads_apart:
                self.loading.append(req)  # no budget: it computes nothing in this step
                continue
            self.running.append(req)
            step.work.append((req, n))
            budget -= n
        return overhead, load_done, budget

    def _preempt(self, req: SimRequest) -> None:
        assert req.hold is not None
        self.kv.release(req.hold)
        req.hold = None
        req.computed = 0
        req.prefilling = True
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    # --- runs of identical steps ------------------------------------------------------

    def extend(self, step: Step) -> None:
        """Let a steady step stand for the run of identical steps that follows it.

        Steady: no admission, no preemption, every scheduled request decodes except at
        most one prompt part-way through its prefill, which takes the rest of the
        budget. The following steps schedule the same requests the same way, and only
        their durations change, linearly (each decode's context grows by one token,
        the chunk's attention by ``chunk`` tokens a step). The run ends before any of
        them finishes or completes its prompt, and before the KV cache runs short.
        Nobody can be admitted meanwhile: there is no budget left, or the waiting
        queue's head was refused and stays refused (free blocks only shrink as
        contexts grow); an arrival at an empty queue cuts the run short (:meth:`truncate`).

        The chunks the prefill computes during the run go to the pool now, each
        findable from the end of the step that computes it (the order in which they
        enter the pool's LRU is the run's start, not each step's end).
        """
        if not step.steady:
            return
        decodes, partial = step.sampled, step.partial
        extra = min((r.output_tokens - r.generated for r in decodes), default=2**62)
        chunk = 0
        if partial is not None:
            chunk = step.work[-1][1]
            extra = min(extra, (partial.num_tokens - partial.computed - 1) // chunk)
        if extra <= 0:
            return
        extra = self._fit_blocks(decodes, partial, chunk, extra)
        if extra <= 0:
            return
        step.delta = run_delta(self.params, len(decodes), chunk, partial is not None)
        step.count = 1 + extra
        step.end = step.boundary(step.count)
        if partial is not None and self.pool.on and partial.pool_stored >= 0:
            self._store_run_chunks(step, partial, chunk)

    def _fit_blocks(
        self, decodes: list[SimRequest], partial: SimRequest | None, chunk: int, extra: int
    ) -> int:
        """The most further steps (at most ``extra``) whose new KV blocks fit."""
        kv = self.kv
        block, available = kv.block_tokens, kv.available_blocks
        # Plain lists: a running batch is a handful of requests (a 128k context fills
        # a tenth of the KV cache), where numpy's fixed cost per call is the whole cost.
        state = [(r.computed, r.hold.logical if r.hold else 0) for r in decodes]
        grows = partial is not None and partial.hold is not None

        def needed(steps: int) -> int:
            total = 0
            for computed, held in state:
                grow = -(-(computed + steps) // block) - held
                if grow > 0:
                    total += grow
            if grows:
                assert partial is not None and partial.hold is not None
                grow = kv.blocks_for(partial.computed + steps * chunk) - partial.hold.logical
                total += max(grow, 0)
            return total

        if needed(extra) <= available:
            return extra
        lo, hi = 0, extra  # needed(lo) fits, needed(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if needed(mid) <= available else (lo, mid)
        return lo

    def _store_run_chunks(self, step: Step, req: SimRequest, chunk: int) -> None:
        size, keys = self.pool.chunk_tokens, req.pool_keys
        stored = req.pool_stored
        for i in range(1, step.count + 1):
            done = min((req.computed + (i - 1) * chunk) // size, len(keys))
            if done > stored:
                self.pool.store(keys[stored:done], step.boundary(i))
                stored = done
        req.pool_stored = stored

    def truncate(self, step: Step, at: float) -> bool:
        """Cut a run of decode steps at the first step boundary at or after ``at``
        (an arrival that can be admitted there). True when the run got shorter."""
        if step.count <= 1 or at >= step.end or not step.open:
            return False
        steps = steps_reaching(step.duration, step.delta, at - step.start)
        while steps > 1 and step.boundary(steps - 1) >= at:
            steps -= 1
        while step.boundary(steps) < at:
            steps += 1
        if steps >= step.count:
            return False
        step.count = steps
        step.end = step.boundary(steps)
        return True

    # --- the end of a step --------------------------------------------------------------

    def complete(self, step: Step) -> list[SimRequest]:
        """Apply a step at its end: further decode steps of a run, blocks and chunks
        made visible, finished requests out (their blocks freed, still cached)."""
        kv, pool = self.kv, self.pool
        block = kv.block_tokens
        extra = step.count - 1
        if extra:  # every step of the run allocated before anybody's blocks are freed
            for req, n in step.work:
                hold = req.hold
                assert hold is not None
                req.computed += extra * n
                if req is not step.partial:
                    req.generated += extra
                need = -(-req.computed // block) - hold.logical
                if need > 0:
                    granted = kv.grow(hold, need)
                    assert granted
        end, store = step.end, pool.on
        for req, _n in step.work:
            hold = req.hold
            if hold is None:
                continue  # aborted meanwhile
            full = req.computed // block
            if full > hold.cached:
                kv.commit(hold, req.keys, full)
            if store and req.pool_stored >= 0:
                self._store_chunks(req, end)
            if req.generated >= req.output_tokens:
                req.finished_at = end
                kv.release(hold)
                req.hold = None
                step.finished.append(req)
        if step.finished:
            self.running = [req for req in self.running if req.finished_at is None]
        return step.finished

    def _store_chunks(self, req: SimRequest, at: float) -> None:
        """Store the prompt chunks computed so far. Each step adds its new chunks; when
        the prompt is all computed, all its chunks are refreshed once, head most recent,
        so the pool evicts a prompt's tail first (``pool_stored = -1`` then: done)."""
        pool = self.pool
        keys = req.pool_keys
        if req.computed >= req.prompt_tokens:
            pool.store(keys, at)
            req.pool_stored = -1
            return
        chunks = min(req.computed // pool.chunk_tokens, len(keys))
        if chunks > req.pool_stored:
            pool.store(keys[req.pool_stored : chunks], at)
            req.pool_stored = chunks

    def abort(self, req: SimRequest) -> None:
        """Drop a request (its client went away): out of the queues, its blocks freed."""
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.loading:
            self.loading.remove(req)
        if req.hold is not None:
            self.kv.release(req.hold)
            req.hold = None
        if req in self.running:
            self.running.remove(req)

    def reset_cache(self) -> None:
        """Drop the cached blocks nobody holds (``/sim/reset``)."""
        self.kv.drop_cached()
