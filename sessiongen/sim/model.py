"""The simulator's timing model: pure functions from a :class:`SimProfile` to seconds.

All results are *modeled* seconds (what one GPU replica plus a shared host-memory pool
would take), already multiplied by ``profile.slowdown``. The server turns them into wall
time by multiplying with the time scale; nothing here knows about wall time. The
engine's terms are written once, in :mod:`.timing`, which both engines run; the
functions here evaluate them for one profile.

A request's time to first token (TTFT) when it is alone on its replica is::

    hit overhead(local hit) + prefill(uncached, cached) + pool load(pool hit) + one ITL

with ``prefill(u, h) = a*u/1000 + b*(((h+u)/1000)^2 - (h/1000)^2)``: a linear term plus
the attention the ``u`` new tokens pay over everything before them, so that a cold
prefill of ``n`` tokens is ``a*n/1000 + b*(n/1000)^2`` (the study's fit to its cold
column). The hit overhead is keyed on the tokens served by the replica's *own* prefix
cache; the pool's cost is its load time (see ``sessiongen/scenario/simprofile.py`` for why).

Under load the scheduler (:mod:`sessiongen.sim.scheduler`) prices each engine step with
the same terms, which is why they are additive:

    step = sum(hit overheads of requests admitted in it) + wait for their pool loads
         + sum(prefill_s(chunk, tokens before the chunk)) + pool_store_s(chunk tokens)
         + decode_step_s(seqs, context)

(the wait for pool loads only when they are synchronous, ``pool_load_mode = "sync"``; the
store cost only with the pool on.)

``prefill_s`` telescopes over the chunks of one prompt (a cold prompt cut into chunks
costs exactly one cold prefill), and ``decode_step_s`` for one sequence is one ITL, so a
request alone on its replica takes exactly the TTFT above. This is the form of the step
models in DistServe's simulator (``a + b*tokens + c*tokens^2`` for prefill, ``a + b*context
+ c*batch`` for decode) and Vidur (token-level, attention and per-batch terms), with our
coefficients from the study.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim import timing
from sessiongen.sim.timing import Params


def prefill_s(profile: SimProfile, uncached: int, cached: int) -> float:
    """Modeled seconds to prefill ``uncached`` tokens that follow ``cached`` cached ones."""
    return timing.prefill_s(Params(profile), uncached, cached)


def hit_overhead_s(profile: SimProfile, local_hit: int) -> float:
    """Modeled fixed-ish cost of a request whose prefix hit the replica's own cache.

    Linear interpolation over ``(hit_overhead_tokens, hit_overhead_s)`` as ``np.interp``
    computes it, flat outside the table; zero when nothing hit locally.
    """
    return timing.hit_overhead_s(Params(profile), local_hit)


def pool_load_s(profile: SimProfile, pool_tokens: int) -> float:
    """Modeled seconds to move ``pool_tokens`` tokens of KV from the shared pool to the GPU."""
    if pool_tokens <= 0:
        return 0.0
    transfer = pool_tokens * profile.kv_bytes_per_token / (profile.pool_bandwidth_gbps * 1e9)
    return profile.slowdown * (profile.pool_load_fixed_s + transfer)


def pool_fixed_s(profile: SimProfile) -> float:
    """Modeled fixed cost of a load from the pool (the part that does not use its link)."""
    return timing.pool_fixed_s(Params(profile))


def pool_transfer_s(profile: SimProfile, pool_tokens: int) -> float:
    """Modeled seconds the pool's link is busy moving ``pool_tokens`` tokens of KV."""
    return timing.pool_transfer_s(Params(profile), pool_tokens)


def pool_store_s(profile: SimProfile, tokens: int) -> float:
    """Modeled seconds a step spends storing the KV of ``tokens`` computed tokens in the
    pool (``pool_store_s_per_gb``; only with the pool on)."""
    return timing.pool_store_s(Params(profile), tokens)


def decode_step_s(profile: SimProfile, seqs: int, context_tokens: int) -> float:
    """The decode part of one engine step: ``seqs`` sequences each sample a token, over
    ``context_tokens`` tokens of KV in total (memory-bound: every sequence's KV is read).

    Zero without sequences; for one sequence it is :func:`itl_s` of its context.
    """
    return timing.decode_step_s(Params(profile), seqs, context_tokens)


def itl_s(profile: SimProfile, context: int, running: int) -> float:
    """Modeled inter-token latency at ``context`` tokens with ``running`` decodes in the batch."""
    return timing.decode_step_s(Params(profile), max(running, 1), context)


@dataclass(frozen=True)
class Timing:
    """The modeled parts of one request's time to first token (seconds, queueing excluded)."""

    overhead_s: float
    prefill_s: float
    pool_load_s: float
    first_token_s: float

    @property
    def busy_s(self) -> float:
        """Time until the prefill is done (the first token's step is then one ITL)."""
        return self.overhead_s + self.prefill_s + self.pool_load_s

    @property
    def ttft_s(self) -> float:
        """Time to first token of a request alone on its replica."""
        return self.busy_s + self.first_token_s


def request_timing(
    profile: SimProfile, prompt_tokens: int, local_hit: int, pool_hit: int, running: int = 1
) -> Timing:
    """Modeled TTFT parts of a prompt of which ``local_hit + pool_hit`` tokens are cached.

    ``running`` is the number of decodes in the batch when the first token is produced
    (this request included).
    """
    cached = local_hit + pool_hit
    return Timing(
        overhead_s=hit_overhead_s(profile, local_hit),
        prefill_s=prefill_s(profile, prompt_tokens - cached, cached),
        pool_load_s=pool_load_s(profile, pool_hit),
        first_token_s=itl_s(profile, prompt_tokens, running),
    )
