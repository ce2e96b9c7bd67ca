"""The fit's numerics: design, weighted solve, identification and bootstrap, on arrays.

Pure and seeded: arrays of requests in, numbers out (:mod:`.fit` reads the runs and
writes the profile). The model is the one in :mod:`.fit`'s docstring.

Decode
    Each request's mean decode gap, TPOT = (e2e - TTFT) / (tokens - 1) (the time per
    output token of vLLM's benchmarks), against the mean context of its decode steps,
    ``n + tokens / 2`` (each step's context grows by the token before it), by
    non-negative least squares. The median gap between content deltas is not used:
    deltas that reach the client in one read have gaps of 0, and a served simulator
    whose step (1.2 ms at time scale 0.1) is near its timer's 1 ms resolution writes
    whole steps late, so its median gap moves by a step at a time while the mean gap
    over the decode is off only by the end points' lateness over ``tokens - 1``.

First token
    ``y = TTFT - ITL(n) = c + X beta`` with ``beta >= 0`` and the request overhead
    ``c`` free (see :mod:`.fit`). The errors are relative (CPU speed, cache state), so
    the variance of a TTFT grows as its mean squared. Weighting rows by the *observed*
    TTFT makes the weights depend on the errors: requests that came out fast weigh
    more, and the fit comes out low (6% in the prefill cost at 20% noise). Weights
    from the *predicted* TTFT, recomputed until they settle (iteratively reweighted
    least squares, the quasi-likelihood fit for variance proportional to mean squared:
    McCullagh & Nelder, *Generalized Linear Models*, 2nd ed. 1989, sec. 9.2; Carroll &
    Ruppert, *Transformation and Weighting in Regression*, 1988, ch. 2) do not. Each
    step is one NNLS (Lawson & Hanson 1974) with the free column projected out.

Identification
    The design's columns, scaled to unit length, are decomposed (SVD); its rank and
    condition number are reported, and a parameter with weight in the null space (a
    combination of columns that is zero on every request) is *not identified by these
    runs*: e.g. pool hits all at one size make the pool's fixed cost and its transfer
    cost one column. Such a set is solved with the lowest-priority members held at 0
    (:data:`HOLD_ORDER`), so that the rest is well posed and still reproduces what was
    measured; every member of the set is reported. A bounded parameter whose estimate
    sits at its bound 0 is reported the same way: the runs would put it lower, or do
    not see it.

Intervals
    Percentile bootstrap (Efron & Tibshirani 1993, ch. 13) over *sessions* (turns of a
    session share their context and its cache state, so they are not independent),
    stratified by (run, context size) so that every resample keeps the design the runs
    were made with (Davison & Hinkley 1997, sec. 3.2.1); with several runs the runs are
    resampled first and then the sessions within each drawn run (two-stage, sec. 3.8),
    so run-to-run variation is in the intervals too. With ``n`` sessions in a stratum
    the resampled spread is ``(n - 1) / n`` of the true variance (3 sessions per size,
    as the probe runs, leave the percentile interval at 0.82 of its width), so the
    draws' deviations from the estimate are scaled by ``sqrt(n / (n - 1))``, with ``n``
    the smallest stratum's (the rescaling bootstrap of Rao & Wu, *JASA* 83:231, 1988);
    bounded parameters' intervals stop at 0. A resample whose design loses rank or
    whose solve fails is counted and left out, and the count is reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import nnls

Array = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: The free (either-sign) parameter of the first-token fit: time every request takes
#: outside the modeled engine work (the client, HTTP, the server's tokenization; in a
#: simulated run, its measurement error). Its column comes first.
OVERHEAD = "request_overhead_s"
#: Bounded (>= 0) first-token parameters, in the order of their columns after the free
#: one (the local-hit overhead at each knot follows).
FIRST_TOKEN_PARAMS = (
    "prefill_s_per_ktok",
    "attn_s_per_ktok2",
    "pool_load_fixed_s",
    "pool_s_per_gb",
    "pool_store_s_per_gb",
)
DECODE_PARAMS = ("itl_base_s", "itl_per_ktok_s")
#: Which member of a set of parameters the runs cannot separate is held at 0 first.
HOLD_ORDER = (
    OVERHEAD,
    "pool_store_s_per_gb",
    "attn_s_per_ktok2",
    "pool_s_per_gb",
    "itl_per_ktok_s",
)
#: Singular values below this share of the largest (columns at unit length) count as 0.
#: Exact collinearity leaves ~1e-16; the probe's designs are at 1e-2 or above.
RANK_TOLERANCE = 1e-9
#: A parameter is in the null space when its loading there exceeds this.
NULL_LOADING = 1e-6
_IRLS_STEPS = 50
_IRLS_TOLERANCE = 1e-10
#: Resamples stop when no weight moves by more than this share between steps: the
#: coefficients then move by far less than the spread of their draws (percents).
_RESAMPLE_TOLERANCE = 1e-4


def knot_name(knot: int) -> str:
    return f"hit_overhead_{knot}"


@dataclass(frozen=True)
class Requests:
    """The requests a fit stands on, one entry each (modeled seconds, tokens)."""

    n: Array  # prompt tokens
    local: Array  # tokens hit in the replica's own cache
    pool: Array  # tokens loaded from the shared pool
    ttft: Array
    tpot: Array  # mean decode gap, NaN without two or more output tokens
    decode_ctx: Array  # mean context of the decode steps
    session: IntArray  # the resampling unit
    stratum: IntArray  # (run, context size) of the session
    run: IntArray
    # 1 where the request ran with the pool on and so stored what it computed (all 0
    # when the runs hold one arm: the store cost is then inside the prefill cost)
    store: Array

    @property
    def size(self) -> int:
        return int(self.n.size)

    def take(self, rows: IntArray) -> Requests:
        return Requests(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


def hat(x: Array, knots: Sequence[int]) -> Array:
    """Interpolation weights of ``x`` on ``knots`` (flat beyond the last), knot 0 dropped:
    ``H(x) = weights @ values`` reproduces ``numpy.interp`` on the knots."""
    out = np.zeros((x.size, len(knots) - 1))
    for j in range(1, len(knots)):
        basis = np.zeros(len(knots))
        basis[j] = 1.0
        out[:, j - 1] = np.interp(x, knots, basis)
    out[x <= 0] = 0.0  # no local hit: no overhead
    return out


def first_token_names(knots: Sequence[int]) -> tuple[str, ...]:
    return (OVERHEAD, *FIRST_TOKEN_PARAMS, *(knot_name(k) for k in knots[1:]))


def first_token_design(r: Requests, knots: Sequence[int], kv_bytes: float) -> Array:
    """Columns of :func:`first_token_names`, one row per request."""
    hit = r.local + r.pool
    u = (r.n - hit) / 1000.0
    attn = (r.n / 1000.0) ** 2 - (hit / 1000.0) ** 2
    pool_on = (r.pool > 0).astype(np.float64)
    pool_gb = r.pool * kv_bytes / 1e9
    stored_gb = r.store * (r.n - hit) * kv_bytes / 1e9
    columns = [np.ones_like(u), u, attn, pool_on, pool_gb, stored_gb, hat(r.local, knots)]
    return np.column_stack(columns)


def decode_design(r: Requests) -> tuple[Array, Array]:
    """Columns of :data:`DECODE_PARAMS` and the mean gaps, rows with decode gaps only."""
    rows = ~np.isnan(r.tpot)
    ctx = r.decode_ctx[rows] / 1000.0
    return np.column_stack([np.ones_like(ctx), ctx]), r.tpot[rows]


@dataclass(frozen=True)
class Identification:
    """What the runs can tell apart: rank and condition of a design, and why not."""

    columns: int
    rank: int
    condition: float  # of the columns solved for, scaled to unit length
    held: tuple[str, ...]  # held at 0 so the rest is well posed
    unidentified: dict[str, str] = field(default_factory=dict)  # name -> why


def _rank(x: Array) -> tuple[int, float, Array]:
    """Rank, condition number and right singular vectors of ``x`` at unit column length."""
    norms = np.linalg.norm(x, axis=0)
    scaled = x / np.where(norms > 0, norms, 1.0)
    _u, s, vt = np.linalg.svd(scaled, full_matrices=False)
    if s.size == 0 or s[0] == 0:
        return 0, math.inf, vt
    rank = int(np.sum(s > s[0] * RANK_TOLERANCE))
    condition = float(s[0] / s[-1]) if s[-1] > s[0] * RANK_TOLERANCE else math.inf
    return rank, condition, vt


def _full_rank(x: Array) -> bool:
    norms = np.linalg.norm(x, axis=0)
    if np.any(norms == 0):
        return False
    s = np.linalg.svd(x / norms, compute_uv=False)
    return bool(s[-1] > s[0] * RANK_TOLERANCE)


def identify(x: Array, names: Sequence[str]) -> Identification:
    """Which parameters the design ``x`` (columns ``names``) leaves undetermined, and
    which to hold at 0 (in :data:`HOLD_ORDER`, then from the last column back) so that
    the others are solved from a design of full rank.

    The request overhead is a term the engine's model does without: when the runs
    cannot separate it (cold requests at two sizes), it alone is held at 0 and the
    others are judged without it, as the model stood before it had the term."""
    rank, _cond, vt = _rank(x)
    why = _unseparated(x, names, rank, vt)
    if OVERHEAD in why and OVERHEAD in names:
        j = list(names).index(OVERHEAD)
        rest = identify(np.delete(x, j, axis=1), [n for n in names if n != OVERHEAD])
        unidentified = {OVERHEAD: why[OVERHEAD] + "; held at 0: the others assume none"}
        unidentified.update(rest.unidentified)
        return Identification(
            len(names), rank, rest.condition, (OVERHEAD, *rest.held), unidentified
        )
    order = [n for n in HOLD_ORDER if n in why] + [n for n in reversed(names) if n in why]
    held: list[str] = []
    keep = list(range(len(names)))
    for name in dict.fromkeys(order):
        if _rank(x[:, keep])[0] == len(keep):
            break
        held.append(name)
        keep.remove(names.index(name))
    _r, condition, _vt = _rank(x[:, keep]) if keep else (0, math.inf, vt)
    return Identification(len(names), rank, condition, tuple(held), why)


def _unseparated(x: Array, names: Sequence[str], rank: int, vt: Array) -> dict[str, str]:
    """Parameters with weight in the design's null space, and those no request measures."""
    why: dict[str, str] = {}
    norms = np.linalg.norm(x, axis=0)
    for j in np.flatnonzero(norms == 0):
        why[names[int(j)]] = "no request measures it"
    null = vt[rank:]
    loads = np.abs(null) > NULL_LOADING
    for i in range(null.shape[0]):
        members = [names[int(j)] for j in np.flatnonzero(loads[i]) if norms[j] > 0]
        for name in members:
            others = [m for m in members if m != name]
            if others:
                why.setdefault(name, "not separable from " + ", ".join(others))
    return why


def nnls_free(a: Array, b: Array, free: NDArray[np.bool_]) -> Array:
    """``min ||a x - b||`` with ``x[free]`` of either sign and the rest ``>= 0``.

    The free columns are projected out (their least-squares fit to whatever the bounded
    ones leave is exact), the bounded ones solved by NNLS at unit column length."""
    bounded = a[:, ~free]
    f = a[:, free]
    if f.shape[1] == 1:  # the request overhead: one column, projected by hand (fast)
        q = f[:, 0] / np.sqrt(f[:, 0] @ f[:, 0])
        bp = bounded - np.outer(q, q @ bounded)
        yp = b - q * (q @ b)
    elif f.shape[1]:
        qm, _ = np.linalg.qr(f)
        bp = bounded - qm @ (qm.T @ bounded)
        yp = b - qm @ (qm.T @ b)
    else:
        bp, yp = bounded, b
    norms = np.sqrt(np.einsum("ij,ij->j", bp, bp))
    norms[norms == 0] = 1.0
    xb, _ = nnls(bp / norms, yp, maxiter=50 * max(1, bp.shape[1]))
    xb /= norms
    x = np.zeros(a.shape[1])
    x[~free] = xb
    if f.shape[1] == 1:
        rest = b - bounded @ xb
        x[free] = (f[:, 0] @ rest) / (f[:, 0] @ f[:, 0])
    elif f.shape[1]:
        x[free] = np.linalg.lstsq(f, b - bounded @ xb, rcond=None)[0]
    return x


@dataclass(frozen=True)
class Solution:
    values: dict[str, float]
    predicted: Array  # modeled TTFT of each request
    weighted: Array  # the final weighted first-token design (columns solved for)


def solve(
    r: Requests,
    knots: Sequence[int],
    kv_bytes: float,
    *,
    held: Sequence[str] = (),
    start: Array | None = None,
    design: Array | None = None,
    tolerance: float = _IRLS_TOLERANCE,
) -> Solution:
    """Decode, then first token by IRLS; ``held`` parameters are 0, ``start`` the
    predicted TTFTs to weight the first step by (default: the measured ones),
    ``design`` the requests' :func:`first_token_design` when already built."""
    values: dict[str, float] = dict.fromkeys(held, 0.0)
    dx, dy = decode_design(r)
    if dy.size == 0:
        raise np.linalg.LinAlgError("no decode gaps")
    keep = [j for j, n in enumerate(DECODE_PARAMS) if n not in held]
    coef, _ = nnls(dx[:, keep], dy)
    for j, c in zip(keep, coef.tolist(), strict=True):
        values[DECODE_PARAMS[j]] = c
    itl = values["itl_base_s"] + values["itl_per_ktok_s"] * r.n / 1000.0

    names = first_token_names(knots)
    cols = [j for j, n in enumerate(names) if n not in held]
    x = (first_token_design(r, knots, kv_bytes) if design is None else design)[:, cols]
    free = np.array([names[j] == OVERHEAD for j in cols])
    y = r.ttft - itl
    floor = max(1e-9, 1e-3 * float(np.median(np.abs(r.ttft))))
    mu: Array = np.maximum(r.ttft if start is None else start, floor)
    beta: Array = np.zeros(len(cols))
    for _ in range(_IRLS_STEPS):
        w = 1.0 / mu
        beta = nnls_free(x * w[:, None], y * w, free)
        new = np.maximum(x @ beta + itl, floor)
        settled = float(np.max(np.abs(new - mu) / mu)) < tolerance
        mu = new
        if settled:
            break
    for j, c in zip(cols, beta.tolist(), strict=True):
        values[names[j]] = c
    return Solution(values, mu, x / mu[:, None])


@dataclass(frozen=True)
class Resampling:
    """Bootstrap draws of every parameter and how many resamples failed."""

    draws: dict[str, Array]
    resamples: int
    failed: int
    runs: int
    sessions: int
    strata: int
    fewest: int  # sessions in the smallest stratum

    def interval(
        self, name: str, estimate: float, conf: float, *, bounded: bool
    ) -> tuple[float, float]:
        """The rescaled percentile interval of ``name`` (module doc); NaN without draws
        or with a stratum of one session (nothing to resample there)."""
        d = self.draws.get(name)
        if d is None or d.size == 0 or self.fewest < 2:
            return math.nan, math.nan
        scale = math.sqrt(self.fewest / (self.fewest - 1))
        tail = (1.0 - conf) / 2.0
        low, high = (estimate + scale * (q - estimate) for q in np.quantile(d, [tail, 1 - tail]))
        return (max(0.0, low) if bounded else low), high


def _groups(r: Requests) -> dict[int, list[list[IntArray]]]:
    """Per run: per stratum, the row indices of each of its sessions."""
    out: dict[int, list[list[IntArray]]] = {}
    for run in np.unique(r.run).tolist():
        strata: list[list[IntArray]] = []
        in_run = r.run == run
        for s in np.unique(r.stratum[in_run]).tolist():
            rows = np.flatnonzero(in_run & (r.stratum == s))
            sessions = [rows[r.session[rows] == u] for u in np.unique(r.session[rows]).tolist()]
            strata.append(sessions)
        out[int(run)] = strata
    return out


def resample_rows(groups: dict[int, list[list[IntArray]]], rng: np.random.Generator) -> IntArray:
    """One two-stage stratified resample: runs (when several), then sessions within
    each stratum of each drawn run, both with replacement."""
    runs = list(groups)
    drawn = [runs[i] for i in rng.integers(0, len(runs), len(runs))] if len(runs) > 1 else runs
    parts: list[IntArray] = []
    for run in drawn:
        for sessions in groups[run]:
            for i in rng.integers(0, len(sessions), len(sessions)).tolist():
                parts.append(sessions[i])
    return np.concatenate(parts)


def bootstrap(
    r: Requests,
    knots: Sequence[int],
    kv_bytes: float,
    full: Solution,
    *,
    held: Sequence[str],
    resamples: int,
    seed: int,
) -> Resampling:
    """Refit on ``resamples`` resamples (:func:`resample_rows`); a resample whose design
    has lower rank than its columns, or whose solve fails, is counted as failed."""
    groups = _groups(r)
    rng = np.random.default_rng(seed)
    x = first_token_design(r, knots, kv_bytes)
    names = list(full.values)
    draws: dict[str, list[float]] = {k: [] for k in names}
    failed = 0
    for _ in range(resamples):
        rows = resample_rows(groups, rng)
        sample = r.take(rows)
        try:
            sol = solve(sample, knots, kv_bytes, held=held, start=full.predicted[rows],
                        design=x[rows], tolerance=_RESAMPLE_TOLERANCE)  # fmt: skip
        except (ValueError, RuntimeError, np.linalg.LinAlgError):
            failed += 1
            continue
        if not _full_rank(sol.weighted):
            failed += 1
            continue
        for k in names:
            draws[k].append(sol.values[k])
    sizes = [len(sessions) for strata in groups.values() for sessions in strata]
    return Resampling(
        {k: np.asarray(v) for k, v in draws.items()},
        resamples,
        failed,
        len(groups),
        int(np.unique(r.session).size),
        len(sizes),
        min(sizes),
    )
