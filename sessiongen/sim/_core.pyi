"""Types of the compiled engine (``_core.pyx``), for mypy."""

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sessiongen.scenario.simprofile import SimProfile

SOURCES: tuple[str, ...]

class Params:
    """The timing terms' numbers (sessiongen.sim.timing.Params, compiled)."""

    def __init__(self, profile: SimProfile) -> None: ...

def timing_terms() -> dict[str, Callable[..., Any]]: ...

class _Req:
    """A request's account, as ``SimRequest`` gives it (read-only)."""

    @property
    def tag(self) -> Any: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def arrival(self) -> float: ...
    @property
    def aborted(self) -> bool: ...
    @property
    def local_hit(self) -> int: ...
    @property
    def pool_hit(self) -> int: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def kv_blocks_at_admission(self) -> int: ...
    @property
    def running_at_admission(self) -> int: ...
    @property
    def waiting_at_admission(self) -> int: ...
    @property
    def admitted_at(self) -> float | None: ...
    @property
    def first_token_at(self) -> float | None: ...
    @property
    def finished_at(self) -> float | None: ...
    def set_keys(self, keys: NDArray[np.uint64]) -> None: ...

class _Step:
    @property
    def end(self) -> float: ...
    @property
    def count(self) -> int: ...
    @property
    def admitted(self) -> list[_Req]: ...
    @property
    def preempted(self) -> list[_Req]: ...
    @property
    def sampled(self) -> list[_Req]: ...
    @property
    def finished(self) -> list[_Req]: ...

class _KVCache:
    @property
    def capacity(self) -> int: ...
    @property
    def usage(self) -> float: ...

class _Sched:
    @property
    def kv(self) -> _KVCache: ...
    @property
    def waiting(self) -> deque[_Req]: ...
    @property
    def running(self) -> list[_Req]: ...
    @property
    def loading(self) -> list[_Req]: ...
    def abort(self, req: _Req) -> None: ...
    def reset_cache(self) -> None: ...

class _Pool:
    on: bool
    def clear(self) -> None: ...

class Cluster:
    now: float
    events: int
    steps: int
    finished: int
    @property
    def pool(self) -> _Pool: ...
    @property
    def replicas(self) -> list[_Sched]: ...
    def __init__(
        self,
        profile: SimProfile,
        *,
        shared_cache: bool,
        collapse: bool,
        on_finish: Callable[[Any], None] | None = None,
        make_result: Callable[..., Any] | None = None,
        listener: Any = None,
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
    ) -> _Req: ...
    def abort(self, req: _Req, replica: int) -> None: ...
    def next_time(self) -> float | None: ...
    def advance(self, until: float, settle: bool = False) -> None: ...

def chain_hash(
    before: NDArray[np.uint64],
    seq: NDArray[np.uint64],
    weights: NDArray[np.uint64],
    scaled: int,
    done: int,
    r_inv: int,
    out: NDArray[np.uint64],
) -> int: ...
def trace_tokens(
    hash_ids: NDArray[np.uint64], length: int, block_tokens: int, out: NDArray[np.uint64]
) -> None: ...

class TraceKeys:
    def __init__(
        self,
        before: NDArray[np.uint64],
        after: NDArray[np.uint64],
        weights: NDArray[np.uint64],
        done: int,
        scaled: int,
        r_inv: int,
        trace_block: int,
        limit: int = ...,
    ) -> None: ...
    @property
    def stored(self) -> int: ...
    @property
    def chain(self) -> tuple[int, int, int]: ...
    @property
    def after_tokens(self) -> int: ...
    def keys(
        self,
        hash_ids: Sequence[int],
        length: int,
        scaled: int,
        out: NDArray[np.uint64],
        at: int,
        tail: NDArray[np.uint64],
    ) -> int: ...
