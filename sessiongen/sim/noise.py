"""Service-time noise: one lognormal factor per request on its prefill compute.

``SimProfile.prefill_noise_sigma`` is the log-standard deviation; the factor is
``exp(sigma * z - sigma**2 / 2)`` with ``z`` standard normal, so its mean is 1 and the
fitted prefill cost stays the mean cost. With ``sigma == 0`` every factor is exactly 1.0
and no random number is drawn.

A session turn's factor is a function of its identity (the key its driver states:
:func:`sessiongen.experiment.script.turn_key`, the run's seed, the block, the session and the
turn), not of the order requests reach the engine:
the planner and the served simulator give the same turn the same factor, and two served
replays of one scenario give it the same factor however their arrivals interleave on the
wall clock. A replay on the simulated pair states the key in a request header
(``X-Sim-Request-Key``). A request without a key (a warm-up, another client's request)
takes the next factor of a stream seeded by the caller, in the order requests are
submitted.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

#: Normals drawn at once for keyless requests.
BATCH = 4096
#: Longest key a request may state (it names four integers).
MAX_KEY_CHARS = 128
_PERSON = b"prefill-noise"
_UNIT = 2.0**-53


def keyed_normal(key: str) -> float:
    """A standard normal that depends on ``key`` only (Box-Muller on two 53-bit uniforms
    of the key's BLAKE2b digest)."""
    digest = hashlib.blake2b(key.encode(), digest_size=16, person=_PERSON).digest()
    u1 = ((int.from_bytes(digest[:8], "little") >> 11) + 1) * _UNIT  # (0, 1]
    u2 = (int.from_bytes(digest[8:], "little") >> 11) * _UNIT  # [0, 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


class PrefillNoise:
    """The factors of one run's requests: by key, else in submit order."""

    def __init__(self, sigma: float, seed: int | Sequence[int]) -> None:
        if not sigma >= 0:
            raise ValueError(f"prefill_noise_sigma: expected >= 0, got {sigma}")
        self.sigma = sigma
        self._shift = sigma * sigma / 2
        self._rng = np.random.default_rng(seed) if sigma > 0 else None
        self._batch: list[float] = []
        self._next = 0

    def factor(self, key: str | None) -> float:
        """The factor of the request ``key`` names; the next of the stream when None."""
        if self._rng is None:
            return 1.0
        if key is None:
            return self.draw()
        return math.exp(self.sigma * keyed_normal(key) - self._shift)

    def draw(self) -> float:
        """The next keyless request's factor."""
        if self._rng is None:
            return 1.0
        if self._next == len(self._batch):
            z = self._rng.standard_normal(BATCH)
            self._batch = np.exp(self.sigma * z - self._shift).tolist()
            self._next = 0
        value = self._batch[self._next]
        self._next += 1
        return value
