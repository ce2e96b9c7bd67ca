"""When sessions start and how long people pause between turns: pure, seeded schedules.

Every schedule depends only on the scenario seed, the load level and the session (and
turn): the OFF and ON blocks of a level replay the same arrivals and the same pauses,
so their sessions stay paired, and two runs of a scenario replay the same load.

- **Arrivals** (open loop, ``load.arrival``): session ``i`` of a block starts at the sum
  of ``i`` gaps (the first at 0). ``poisson``: exponential gaps of mean ``1 / rate``;
  ``constant``: equal gaps; ``gamma``: gaps of shape ``k = burstiness`` and scale
  ``1 / (rate k)`` (mean ``1 / rate``, coefficient of variation ``1 / sqrt(k)``), as in
  vLLM's serving benchmark. Closed loop has no schedule: a session starts when a
  concurrency slot frees.
- **Think time** (``sessions.think``): the pause before turn ``k >= 2``, mean
  ``think_time_s``. ``fixed``: exactly the mean; ``exponential``; ``lognormal`` with
  shape ``think_sigma`` and the location that keeps the mean
  (``mu = ln(mean) - sigma^2 / 2``).

All times are modeled seconds; replay multiplies by the target's time scale.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
from numpy.typing import NDArray

from sessiongen.scenario.spec import LoadSpec, SessionsSpec


def _rng(*key: object) -> np.random.Generator:
    digest = hashlib.blake2b("\x1f".join(map(str, key)).encode(), digest_size=16).digest()
    # The words as an array, not a list of numpy scalars: the same seed (SeedSequence
    # takes each word as one uint32 either way), a third cheaper per session.
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))


def arrival_offsets(load: LoadSpec, rate: float, n: int, seed: int) -> list[float]:
    """Start offsets (modeled seconds from the block's start) of ``n`` sessions."""
    if n <= 0:
        return []
    if load.arrival == "closed":
        return [0.0] * n
    mean = 1.0 / rate
    gaps: NDArray[np.float64]
    if load.arrival == "constant":
        gaps = np.full(n - 1, mean)
    else:
        shape = 1.0 if load.arrival == "poisson" else load.burstiness
        gaps = _rng(seed, "arrivals", load.arrival, shape, rate).gamma(shape, mean / shape, n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def think_times(sessions: SessionsSpec, session_index: int, seed: int) -> list[float]:
    """Pauses before turns 1..turns of one session (turn 1: 0), modeled seconds."""
    mean, turns = sessions.think_time_s, sessions.turns
    if mean <= 0 or turns < 2:
        return [0.0] * turns
    pauses: NDArray[np.float64]
    if sessions.think == "fixed":
        pauses = np.full(turns - 1, mean)
    else:
        rng = _rng(seed, "think", sessions.think, session_index)
        if sessions.think == "exponential":
            pauses = rng.exponential(mean, turns - 1)
        else:
            sigma = sessions.think_sigma
            pauses = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, turns - 1)
    return [0.0, *pauses.tolist()]


#: Closed-loop sessions of a block start this far apart (modeled seconds), in order:
#: never in the same instant, so the first to reach an idle replica starts a step alone
#: and the others join the next one, as in vLLM. The planner and a replay that states
#: its modeled arrivals (:mod:`sessiongen.replay.modeled`) both follow it.
START_STAGGER_S = 1e-6
