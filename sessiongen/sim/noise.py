"""Service-time noise: one lognormal factor per request on its prefill compute.

``SimProfile.prefill_noise_sigma`` is the log-standard deviation; the factor is
``exp(sigma * z - sigma**2 / 2)`` with ``z`` standard normal, so its mean is 1 and the
fitted prefill cost stays the mean cost. Factors are drawn in the order requests are
submitted, from a stream seeded by the caller (the run's seed and the block), so a plan
is reproducible and both engines see the same factors. With ``sigma == 0`` every factor
is exactly 1.0 and no random number is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Normals drawn at once (a day of day128k submits half a million requests).
BATCH = 4096


class PrefillNoise:
    """The factors of one run's requests, in submit order."""

    def __init__(self, sigma: float, seed: int | Sequence[int]) -> None:
        if not sigma >= 0:
            raise ValueError(f"prefill_noise_sigma: expected >= 0, got {sigma}")
        self.sigma = sigma
        self._shift = sigma * sigma / 2
        self._rng = np.random.default_rng(seed) if sigma > 0 else None
        self._batch: list[float] = []
        self._next = 0

    def draw(self) -> float:
        """The next request's factor."""
        if self._rng is None:
            return 1.0
        if self._next == len(self._batch):
            z = self._rng.standard_normal(BATCH)
            self._batch = np.exp(self.sigma * z - self._shift).tolist()
            self._next = 0
        value = self._batch[self._next]
        self._next += 1
        return value
