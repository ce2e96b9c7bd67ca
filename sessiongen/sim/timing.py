"""The engine's timing terms, written once for both engines.

This file is Python that Cython also compiles: the pure-Python engine
(:mod:`.scheduler`, :mod:`.pool`) imports it as it is, and the compiled engine
(``_core.pyx``) includes its text, where the annotations make :class:`Params` a typed
object and each term an inlined C function. A term changed here changes in both
engines; ``tests/unit/sim/test_timing.py`` evaluates each term both ways. Where no
compiler is at hand the decorators do nothing (Cython's pure-Python mode), and
``cython.cimports.libc.math`` is Python's :mod:`math`.

The terms are those of :mod:`.model` (which documents the model and keeps the
profile-level functions that tests and the fit call), over a profile's numbers read
once into :class:`Params`; the run arithmetic (:func:`boundary`, :func:`run_delta`,
:func:`steps_reaching`) is the scheduler's collapse of identical decode steps. Every
expression is evaluated as Python evaluates it, in the same order, so the two engines
give the same bits (the build turns off fused multiply-adds).
"""

from typing import TYPE_CHECKING

import cython
from cython.cimports.libc.math import ceil, pow, sqrt

if TYPE_CHECKING:
    from sessiongen.scenario.simprofile import SimProfile


@cython.cclass
class Params:
    """A profile's numbers as the engine reads them (typed fields where compiled)."""

    slowdown: cython.double
    max_num_batched_tokens: cython.longlong
    max_num_seqs: cython.longlong
    block_tokens: cython.longlong
    cache_blocks: cython.longlong
    chunk_tokens: cython.longlong
    kv_bytes_per_token: cython.longlong
    pool_bandwidth_gbps: cython.double
    pool_load_fixed_s: cython.double
    pool_store_s_per_gb: cython.double
    prefill_s_per_ktok: cython.double
    attn_s_per_ktok2: cython.double
    itl_base_s: cython.double
    itl_per_ktok_s: cython.double
    itl_per_batch_s: cython.double
    async_loads: cython.bint
    hit_tokens: tuple  # type: ignore[type-arg]
    hit_seconds: tuple  # type: ignore[type-arg]

    def __init__(self, profile: "SimProfile") -> None:
        self.slowdown = float(profile.slowdown)
        self.max_num_batched_tokens = int(profile.max_num_batched_tokens)
        self.max_num_seqs = int(profile.max_num_seqs)
        self.block_tokens = int(profile.local_block_tokens)
        self.cache_blocks = int(profile.local_cache_tokens) // self.block_tokens
        self.chunk_tokens = int(profile.pool_chunk_tokens)
        self.kv_bytes_per_token = int(profile.kv_bytes_per_token)
        self.pool_bandwidth_gbps = float(profile.pool_bandwidth_gbps)
        self.pool_load_fixed_s = float(profile.pool_load_fixed_s)
        self.pool_store_s_per_gb = float(profile.pool_store_s_per_gb)
        self.prefill_s_per_ktok = float(profile.prefill_s_per_ktok)
        self.attn_s_per_ktok2 = float(profile.attn_s_per_ktok2)
        self.itl_base_s = float(profile.itl_base_s)
        self.itl_per_ktok_s = float(profile.itl_per_ktok_s)
        self.itl_per_batch_s = float(profile.itl_per_batch_s)
        self.async_loads = profile.pool_load_mode == "async"
        # floats, as the compiled table holds them (exact: token counts are below 2^53)
        self.hit_tokens = tuple(float(x) for x in profile.hit_overhead_tokens)
        self.hit_seconds = tuple(float(y) for y in profile.hit_overhead_s)


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def prefill_s(p: Params, uncached: cython.longlong, cached: cython.longlong) -> cython.double:
    """Seconds to prefill ``uncached`` tokens after ``cached`` ones (:func:`.model.prefill_s`)."""
    h: cython.double
    total: cython.double
    linear: cython.double
    attention: cython.double
    if uncached <= 0:
        return 0.0
    h = cached / 1000.0
    total = (cached + uncached) / 1000.0
    linear = p.prefill_s_per_ktok * uncached / 1000.0
    attention = p.attn_s_per_ktok2 * (total * total - h * h)
    return p.slowdown * (linear + attention)


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def decode_step_s(p: Params, seqs: cython.longlong, context: cython.longlong) -> cython.double:
    """The decode part of a step of ``seqs`` sequences over ``context`` tokens of KV."""
    value: cython.double
    if seqs <= 0:
        return 0.0
    value = p.itl_base_s + p.itl_per_ktok_s * context / 1000.0 + p.itl_per_batch_s * (seqs - 1)
    return p.slowdown * value


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def pool_store_s(p: Params, tokens: cython.longlong) -> cython.double:
    """Seconds a step spends storing ``tokens`` computed tokens' KV in the pool."""
    gb: cython.double = tokens * p.kv_bytes_per_token / 1e9
    return p.slowdown * p.pool_store_s_per_gb * gb


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def pool_fixed_s(p: Params) -> cython.double:
    """The fixed part of a pool load (lookup, allocation), off the pool's link."""
    return p.slowdown * p.pool_load_fixed_s


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def pool_transfer_s(p: Params, tokens: cython.longlong) -> cython.double:
    """Seconds the pool's link is busy moving ``tokens`` tokens of KV."""
    transfer: cython.double = tokens * p.kv_bytes_per_token / (p.pool_bandwidth_gbps * 1e9)
    return p.slowdown * transfer


@cython.cfunc
@cython.exceptval(check=False)
def hit_overhead_s(p: Params, local_hit: cython.longlong) -> cython.double:
    """The overhead of a local prefix hit: the profile's table, interpolated as
    ``np.interp`` does (the same branches and arithmetic as its C loop), flat outside."""
    xs: tuple = p.hit_tokens  # type: ignore[type-arg]
    ys: tuple = p.hit_seconds  # type: ignore[type-arg]
    x: cython.double = local_hit
    last: cython.Py_ssize_t
    lo: cython.Py_ssize_t
    hi: cython.Py_ssize_t
    mid: cython.Py_ssize_t
    x0: cython.double
    y0: cython.double
    slope: cython.double
    if local_hit <= 0:
        return 0.0
    if x < cython.cast(cython.double, xs[0]):
        return p.slowdown * cython.cast(cython.double, ys[0])
    last = len(xs) - 1
    if x >= cython.cast(cython.double, xs[last]):
        return p.slowdown * cython.cast(cython.double, ys[last])
    lo, hi = 0, last + 1  # bisect_right(xs, x) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if x < cython.cast(cython.double, xs[mid]):
            hi = mid
        else:
            lo = mid + 1
    x0 = xs[lo - 1]
    y0 = ys[lo - 1]
    if x0 == x:
        return p.slowdown * y0
    slope = (cython.cast(cython.double, ys[lo]) - y0) / (cython.cast(cython.double, xs[lo]) - x0)
    return p.slowdown * (slope * (x - x0) + y0)


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def boundary(
    start: cython.double, duration: cython.double, delta: cython.double, steps: cython.longlong
) -> cython.double:
    """The end of the ``steps``-th step of a run whose first step takes ``duration`` and
    each later one ``delta`` longer than the one before."""
    return start + steps * duration + delta * steps * (steps - 1) / 2.0


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def run_delta(
    p: Params, decodes: cython.longlong, chunk: cython.longlong, partial: cython.bint
) -> cython.double:
    """How much longer each step of a run is than the one before: every one of
    ``decodes`` sequences' context grows by a token, and a ``partial`` prompt taking
    ``chunk`` tokens a step pays attention over ``chunk`` more tokens each step."""
    delta: cython.double = p.itl_per_ktok_s * decodes / 1000.0
    if partial:
        delta += p.attn_s_per_ktok2 * 2.0 * pow(chunk / 1000.0, 2.0)
    return p.slowdown * delta


@cython.cfunc
@cython.exceptval(check=False)
def steps_reaching(
    duration: cython.double, delta: cython.double, elapsed: cython.double
) -> cython.longlong:
    """A first guess (at least 1) of how many steps of a run reach ``elapsed`` seconds
    past its start: the root of the run's quadratic :func:`boundary`; the caller walks
    it to the exact boundary."""
    a: cython.double
    b: cython.double
    guess: cython.double
    steps: cython.longlong
    if delta > 0:
        a, b = delta / 2.0, duration - delta / 2.0
        guess = (-b + sqrt(b * b + 4.0 * a * (elapsed if elapsed > 0.0 else 0.0))) / (2.0 * a)
    else:
        guess = elapsed / duration if duration > 0 else 1.0
    steps = cython.cast(cython.longlong, ceil(guess))
    return steps if steps >= 1 else 1
