"""Types of the compiled engine (``_core.pyx``), for mypy."""

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sessiongen.scenario.simprofile import SimProfile

class Cluster:
    now: float
    events: int
    steps: int
    def __init__(
        self,
        profile: SimProfile,
        *,
        shared_cache: bool,
        collapse: bool,
        on_finish: Callable[[Any], None],
        make_result: Callable[..., Any],
    ) -> None: ...
    def submit(
        self,
        arrival: float,
        replica: int,
        prompt_tokens: int,
        output_tokens: int,
        head: NDArray[np.uint64],
        keys: NDArray[np.uint64],
        pool_keys: NDArray[np.uint64],
        tag: Any,
        prefill_scale: float = 1.0,
    ) -> None: ...
    def next_time(self) -> float | None: ...
    def advance(self, until: float) -> None: ...

def chain_hash(
    seq: NDArray[np.uint64],
    weights: NDArray[np.uint64],
    scaled: int,
    done: int,
    r_inv: int,
    out: NDArray[np.uint64],
) -> int: ...
