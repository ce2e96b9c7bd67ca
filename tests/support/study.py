"""The study's probe, replayed on the pure model, for calibrating the default profile.

The figures are the median times to first content token (cache ON arm) published in
"Shared KV Caching for Replicated 27B Inference: Correctness Failures and Performance
Boundaries" (arXiv 2609.15021), as recorded in the project's calibration notes
(``shared/calibration.md``). Its cold column fits ``0.136*(n/1000) + 8.7e-4*(n/1000)^2``
to within 0.3% when ``8k`` means 8,000 tokens (not 8,192), so the probe prompts are
multiples of 1,000 tokens.

The probe, as in the study: a cold request with an ``n``-token prompt; a *local hit*,
the same prefix plus a new 32-token question on the same replica; a *cross-replica
hit*, the same prefix plus another new question on the other replica with the pool on.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.model import request_timing
from sessiongen.sim.virtual import Arrival, RequestResult, VirtualDriver

Probe = Literal["cold", "local", "cross"]
PROBES: tuple[Probe, ...] = ("cold", "local", "cross")

#: Study medians, seconds: prompt tokens -> (cold, local hit, cross-replica hit).
STUDY_TTFT_S: dict[int, tuple[float, float, float]] = {
    8_000: (1.16, 0.050, 0.095),
    32_000: (5.25, 0.181, 0.221),
    128_000: (31.76, 0.484, 0.605),
    256_000: (92.11, 0.557, 0.790),
}

QUESTION_TOKENS = 32


def probe_prompts(n: int, question_tokens: int = QUESTION_TOKENS) -> dict[Probe, np.ndarray]:
    """Token ids of the three probe prompts for an ``n``-token context.

    Ids are arbitrary but distinct: the context is ``0..n-1`` and each question uses its
    own id range, so the two questions share no block with each other.
    """
    context = np.arange(n, dtype=np.uint32)
    first = np.arange(10**7, 10**7 + question_tokens, dtype=np.uint32)
    second = first + np.uint32(question_tokens)
    return {
        "cold": context,
        "local": np.concatenate([context, first]),
        "cross": np.concatenate([context, second]),
    }


@functools.cache
def run_probes(profile: SimProfile, n: int) -> dict[Probe, RequestResult]:
    """The three probes through the simulator's engine on a virtual clock, one at a time:
    cold and local on replica 0, cross on replica 1 (pool on), one output token each."""
    prompts = probe_prompts(n)
    driver = VirtualDriver(profile)
    out: dict[Probe, RequestResult] = {}
    at = 0.0
    for probe, replica in (("cold", 0), ("local", 0), ("cross", 1)):
        driver.submit(Arrival(at=at, replica=replica, prompt=prompts[probe], max_tokens=1))
        out[probe] = driver.run()[-1]
        at = out[probe].finished_s + 1.0
    return out


def probe_hits(profile: SimProfile, n: int) -> dict[Probe, tuple[int, int, int]]:
    """(prompt tokens, local hit, pool hit) of each probe, as the engine finds them."""
    return {
        probe: (r.prompt_tokens, r.local_hit_tokens, r.pool_hit_tokens)
        for probe, r in run_probes(profile, n).items()
    }


def probe_ttft(profile: SimProfile, n: int) -> dict[Probe, float]:
    """Modeled TTFT (seconds) of the cold, local-hit and cross-replica-hit probes."""
    return {
        probe: request_timing(profile, tokens, local, pool).ttft_s
        for probe, (tokens, local, pool) in probe_hits(profile, n).items()
    }


def calibration_table(profile: SimProfile) -> dict[int, dict[Probe, tuple[float, float]]]:
    """For every study row and probe: (modeled seconds, study seconds)."""
    table: dict[int, dict[Probe, tuple[float, float]]] = {}
    for n, study in STUDY_TTFT_S.items():
        modeled = probe_ttft(profile, n)
        table[n] = {p: (modeled[p], study[i]) for i, p in enumerate(PROBES)}
    return table
