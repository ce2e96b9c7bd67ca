"""The simulator on a virtual clock: scripted arrivals in, per-request results out.

No HTTP, no sleeping, no wall clock: :class:`VirtualDriver` runs the same engine as the
served simulator (:class:`~sessiongen.sim.cluster.Cluster`), or its compiled twin where
it was built (``sessiongen/sim/_core.pyx``: the same results, several times faster), and
jumps from one event to the next, so modeled hours take wall seconds. It is what the
capacity planner runs.

::

    driver = VirtualDriver(profile, on_finish=next_turn)
    driver.submit(Arrival(at=0.0, replica=0, prompt=ids, max_tokens=200, tag=("s1", 1)))
    results = driver.run()

``on_finish`` is called at each request's modeled end with its :class:`RequestResult`;
it may :meth:`~VirtualDriver.submit` the session's next turn (at or after that end, think
time included). Prompts are token ids or, for speed, :class:`~sessiongen.sim.cache.PromptKeys`
extended turn by turn (the previous prompt, its answer, the new question), which hashes
only the new tokens (the question together with the next turn's answer, when that turn
is submitted). With ``output_ids`` the answer's full KV blocks are cached under
their keys, so a next turn that contains the answer reuses them on the same replica;
an ``answer`` chain made by the caller gives the keys directly.

Decode-only stretches are collapsed (``collapse=True``): a run of identical decode steps
is one event, cut short by any arrival at its replica, so the cost grows with prefill
steps and requests, not with output tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.cache import KeyChain, PromptKeys
from sessiongen.sim.cluster import Cluster
from sessiongen.sim.compiled import Engine, core, resolve
from sessiongen.sim.noise import PrefillNoise
from sessiongen.sim.scheduler import SimRequest, Step

if TYPE_CHECKING:  # built by pip install; absent where no compiler was at hand
    from sessiongen.sim._core import Cluster as CompiledCluster


class Arrival(NamedTuple):
    """One request, as scripted: when, where, what and how much output (a named tuple:
    the planner makes one per request, and a frozen dataclass cost 5x to make)."""

    at: float
    replica: int
    prompt: PromptKeys | NDArray[Any] | Sequence[int]
    max_tokens: int
    output_ids: NDArray[Any] | Sequence[int] | None = None
    tag: Any = None
    noise_key: str | None = None  # the request's service-time noise key (sim/noise.py)
    # the block keys of the prompt and its answer, made by the caller instead of from
    # ``output_ids`` (KeyChain.extend_unique: an answer nothing extends)
    answer: KeyChain | None = None


class RequestResult(NamedTuple):
    """What happened to one request, in modeled seconds since the clock's zero.

    A named tuple: the compiled engine builds one per request (a frozen dataclass's
    ``__init__`` cost more than the engine's whole work on the request).
    """

    tag: Any
    replica: int
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    admitted_s: float
    first_token_s: float
    finished_s: float
    local_hit_tokens: int
    pool_hit_tokens: int
    preemptions: int
    kv_blocks_at_admission: int
    running_at_admission: int
    waiting_at_admission: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finished_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        """Time in the waiting queue before the first admission."""
        return self.admitted_s - self.arrival_s


def result_of(req: SimRequest, replica: int) -> RequestResult:
    """A finished request's :class:`RequestResult`."""
    assert req.admitted_at is not None and req.first_token_at is not None
    assert req.finished_at is not None
    return RequestResult(
        tag=req.tag,
        replica=replica,
        prompt_tokens=req.prompt_tokens,
        output_tokens=req.output_tokens,
        arrival_s=req.arrival,
        admitted_s=req.admitted_at,
        first_token_s=req.first_token_at,
        finished_s=req.finished_at,
        local_hit_tokens=req.local_hit,
        pool_hit_tokens=req.pool_hit,
        preemptions=req.preemptions,
        kv_blocks_at_admission=req.kv_blocks_at_admission,
        running_at_admission=req.running_at_admission,
        waiting_at_admission=req.waiting_at_admission,
    )


class VirtualDriver:
    """The engine on a virtual clock (see the module doc).

    ``engine``: the compiled engine where it was built, else the Python one (``auto``,
    see :mod:`sessiongen.sim.compiled`); both give the same results. Only the Python
    engine tells a subclass of each step (:meth:`step_started`, :meth:`step_ended`).
    ``keep_results=False`` keeps no results (a planned day's would be a million
    objects): ``on_finish`` is then where they go.
    """

    def __init__(
        self,
        profile: SimProfile,
        *,
        shared_cache: bool = True,
        collapse: bool = True,
        on_finish: Callable[[RequestResult], None] | None = None,
        engine: Engine = "auto",
        keep_results: bool = True,
        noise_seed: int | Sequence[int] = 0,
    ) -> None:
        self.profile = profile
        self.noise = PrefillNoise(profile.prefill_noise_sigma, noise_seed)
        self.engine = resolve(engine)
        self.on_finish = on_finish
        self.results: list[RequestResult] = []
        self.keep_results = keep_results
        self._steps = 0
        self.cluster: Cluster | CompiledCluster
        if self.engine == "compiled":
            module = core()
            assert module is not None
            # kept or not, a result is the caller's: handed straight to it when not kept
            direct = on_finish is not None and not keep_results
            self.cluster = module.Cluster(
                profile,
                shared_cache=shared_cache,
                collapse=collapse,
                on_finish=on_finish if direct else self._finished,
                make_result=RequestResult,
            )
        else:
            self.cluster = Cluster(
                profile, shared_cache=shared_cache, listener=self, collapse=collapse
            )

    @property
    def steps(self) -> int:
        """Engine steps taken so far (a collapsed run counts each of its steps)."""
        if isinstance(self.cluster, Cluster):
            return self._steps
        return self.cluster.steps

    @property
    def now(self) -> float:
        """The time of the latest event processed (-inf before the first)."""
        return self.cluster.now

    def keys(self, prompt: PromptKeys | NDArray[Any] | Sequence[int]) -> PromptKeys:
        """A prompt's keys at this profile's block and chunk sizes."""
        if isinstance(prompt, PromptKeys):
            return prompt
        p = self.profile
        return PromptKeys.of(np.asarray(prompt), p.local_block_tokens, p.pool_chunk_tokens)

    def submit(self, arrival: Arrival) -> None:
        """Schedule one request. Raises ValueError for a time already past or bad sizes."""
        if arrival.at < self.cluster.now:
            raise ValueError(f"arrival at {arrival.at} is before now ({self.cluster.now})")
        keys = self.keys(arrival.prompt)
        if keys.local.block_tokens != self.profile.local_block_tokens:
            raise ValueError("prompt keys were built for another block size")
        # The prompt is hashed before its extension by the answer: the prompt then
        # appends to the buffer of the turn it extends, and the answer to the prompt's,
        # instead of each copying a 128k context's keys into a buffer of its own (a
        # quarter of a planned day's CPU, most of it first touches of fresh memory).
        pool_keys = keys.pool.keys
        local = keys.local
        if arrival.answer is not None:
            if arrival.answer.tokens != keys.tokens + arrival.max_tokens:
                raise ValueError("answer: expected the prompt's tokens plus max_tokens")
            local = arrival.answer
        elif arrival.output_ids is not None:
            if len(arrival.output_ids) != arrival.max_tokens:
                raise ValueError("output_ids: expected max_tokens ids")
            local = local.extend(arrival.output_ids)
        tokens = keys.tokens + arrival.max_tokens
        if tokens > self.profile.max_model_len:
            raise ValueError(f"{tokens} tokens exceed max_model_len")
        if not 0 <= arrival.replica < self.profile.replicas:
            raise ValueError(f"replica {arrival.replica} outside 0..{self.profile.replicas - 1}")
        cluster = self.cluster
        if isinstance(cluster, Cluster):
            req = SimRequest(
                prompt_tokens=keys.tokens,
                output_tokens=arrival.max_tokens,
                keys=local.keys,
                pool_keys=pool_keys.tolist(),
                arrival=arrival.at,
                tag=arrival.tag,
                prefill_scale=self.noise.factor(arrival.noise_key),
            )
            cluster.submit(req, arrival.replica)
        else:
            head, own = local.segments
            cluster.submit(
                arrival.at,
                arrival.replica,
                keys.tokens,
                arrival.max_tokens,
                head,
                own,
                np.ascontiguousarray(pool_keys),
                arrival.tag,
                self.noise.factor(arrival.noise_key),
            )

    def run(self, until: float = math.inf, *, settle: bool = False) -> list[RequestResult]:
        """Process every event up to ``until`` (``settle``: only up to the time of the
        first request that finishes; :meth:`sessiongen.sim.cluster.Cluster.advance`);
        returns all results so far (end order)."""
        self.cluster.advance(until, settle)
        return self.results

    # Listener
    def step_started(self, replica: int, step: Step) -> None:
        return None

    def step_ended(self, replica: int, step: Step) -> None:
        self._steps += step.count
        for req in step.finished:
            self._finished(result_of(req, replica))

    def _finished(self, result: RequestResult) -> None:
        if self.keep_results:
            self.results.append(result)
        if self.on_finish is not None:
            self.on_finish(result)
