"""A planned gain's interval with everything not known in it: sampling, the profile's
parameters, and the model's own error.

A planned gain ``g`` (an OFF / ON ratio) is uncertain for three independent reasons,
each written as a half-width on the log scale, where ratios add:

- **sampling** (``h_s``, one per side): the traffic's own spread, the paired bootstrap
  of the replicates' units pooled (sessions, or for traces blocks of time:
  :func:`sessiongen.analysis.latency.session_speedup`). Identical replicates are pooled
  once (:func:`distinct`): a replicate that repeats another's records learned nothing,
  so it neither narrows the interval nor counts as more sessions;
- **parameters** (``h_p``): when the replicates plan with the fit's bootstrap draws of
  the profile, their gains spread as the parameters do. The true parameters are one
  draw of that distribution, not its mean, so the spread enters at full weight: a
  predictive interval for one more replicate, ``t_{R-1, 0.975} * s * sqrt(1 + 1/R)``
  over the ``R`` distinct replicates' log gains (their SD ``s``; Geisser 1993, the
  normal predictive interval). Without draws the parameters are taken as exact, and
  said so (the sensitivity box shows what they would move);
- **model** (``h_m = 1.96 * sigma``): the simulator is a model of the replicas; its
  error against measured gains on held-out runs, per regime
  (:mod:`sessiongen.capacity.evidence`), lognormal with SD ``sigma``.

Independent errors add in variance (the root sum of squares of the GUM, JCGM 100:2008
section 5.1.2), so each side's half-width is ``sqrt(h_s^2 + h_p^2 + h_m^2)`` and the
interval ``[g exp(-h_low), g exp(h_high)]``, then widened to hold every replicate's own
gain (a replicate the model planned is a value the interval must not exclude). Each
part's share is its variance over the sum, averaged over the two sides. An interval is
never of zero width while a model error is known: where sampling gives none (every
unit alike, no noise) the note says the interval is the model's error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from sessiongen.infra.lazy import lazy_module
from sessiongen.records.run import Run

if TYPE_CHECKING:
    from scipy import stats as sps
else:
    sps = lazy_module("scipy.stats")

#: The normal quantile of a two-sided 95% interval.
Z95 = 1.959963984540054
#: A log half-width below this is no width (float rounding of equal values' ratio).
TINY = 1e-6
#: The columns that identify a replicate's records: two replicates with equal values
#: in all of them planned the same requests with the same times.
FINGERPRINT = ("placement", "cache", "context_tokens", "load_level", "block",
               "session_index", "turn", "status", "ttft_s", "e2e_s")  # fmt: skip


def distinct(runs: Sequence[Run]) -> list[int]:
    """The indices of ``runs`` whose records no earlier run repeats (module doc)."""
    kept: list[int] = []
    frames: list[pl.DataFrame] = []
    for i, run in enumerate(runs):
        cols = [c for c in FINGERPRINT if c in run.requests.columns]
        frame = run.requests.select(cols).sort(cols[:-2], nulls_last=True)
        if not any(frame.equals(seen) for seen in frames):
            kept.append(i)
            frames.append(frame)
    return kept


@dataclass(frozen=True)
class Combined:
    """A gain's interval with its parts (module doc); NaN bounds where the sampling
    interval is missing."""

    estimate: float
    low: float
    high: float
    share_sampling: float
    share_parameters: float
    share_model: float
    note: str


def predictive_half_width(log_gains: Sequence[float]) -> float:
    """``t_{R-1, 0.975} * s * sqrt(1 + 1/R)`` over ``R`` replicates' log gains (module
    doc); NaN for fewer than two."""
    x = np.asarray([v for v in log_gains if math.isfinite(v)], dtype=np.float64)
    r = x.size
    if r < 2:
        return math.nan
    t = float(sps.t.ppf(0.975, r - 1))
    return t * float(x.std(ddof=1)) * math.sqrt(1.0 + 1.0 / r)


def combine(
    estimate: float | None,
    low: float | None,
    high: float | None,
    replicate_gains: Sequence[float],
    *,
    drawn: bool,
    sigma: float,
) -> Combined:
    """The interval of ``estimate`` (sampling interval ``[low, high]``) with the
    parameters' spread over ``replicate_gains`` (when ``drawn``: the replicates carry
    parameter draws) and the model error ``sigma`` (module doc)."""
    if not all(v is not None and math.isfinite(v) and v > 0 for v in (estimate, low, high)):
        point = math.nan if estimate is None else estimate
        return Combined(point, math.nan, math.nan, math.nan, math.nan, math.nan, "no interval")
    assert estimate is not None and low is not None and high is not None
    centre = math.log(estimate)
    logs = [math.log(g) for g in replicate_gains if g is not None and math.isfinite(g) and g > 0]
    sides = (max(0.0, centre - math.log(low)), max(0.0, math.log(high) - centre))
    notes = []
    param = 0.0
    if drawn:
        param = predictive_half_width(logs)
        if not math.isfinite(param):
            param = 0.0
            notes.append("parameter draws not sampled (one distinct replicate: --seeds 2 or more)")
    else:
        notes.append("profile parameters taken as exact (no draws)")
    model = Z95 * sigma if math.isfinite(sigma) else 0.0
    if not math.isfinite(sigma):
        notes.append("no model error known for this regime")
    if max(sides) < TINY and param < TINY:
        notes.append(
            "no sampling variation; the interval is the model's error"
            if model > 0
            else "no sampling variation and no model error: the interval has no width"
        )
    half = [math.sqrt(s * s + param * param + model * model) for s in sides]
    lo = math.exp(centre - half[0])
    hi = math.exp(centre + half[1])
    if logs:
        lo, hi = min(lo, math.exp(min(logs))), max(hi, math.exp(max(logs)))
    sides = (0.0 if sides[0] < TINY else sides[0], 0.0 if sides[1] < TINY else sides[1])
    total = sum(h * h for h in half)
    if total > 0:
        shares = (
            sum(s * s for s in sides) / total,
            2 * param * param / total,
            2 * model * model / total,
        )
    else:
        shares = (math.nan, math.nan, math.nan)
    return Combined(estimate, lo, hi, *shares, "; ".join(notes))


#: The gains whose intervals :func:`with_uncertainty` combines (what-if columns with
#: ``_low`` / ``_high``; the replicates' own values in ``{gain}_replicates``).
GAINS = ("session_gain", "later_gain")


def regime(*, closed: bool, level: float | None, busiest: float | None = None) -> str:
    """The model error's regime of a cell (:data:`sessiongen.capacity.evidence.REGIMES`):
    one session in flight on a closed loop at level 1, or an open loop (a trace) that had
    at most one request in flight 90% of its time in both arms (``busiest``: the larger
    arm's ``in_flight_p90``, as measured on the planned records); else loaded."""
    if closed:
        return "one_in_flight" if level is None or level <= 1 else "loaded"
    return "one_in_flight" if busiest is not None and busiest <= 1 else "loaded"


def with_uncertainty(
    rows: pl.DataFrame, sigmas: dict[str, float], *, drawn: bool, closed: bool
) -> pl.DataFrame:
    """``rows`` (what-if rows with ``{gain}_replicates`` lists) with each gain's
    interval combined (:func:`combine`): the sampling interval kept as
    ``{gain}_sampling_low/high``, ``{gain}_low/high`` the combined one; the session
    gain's parts as ``share_sampling`` / ``share_parameters`` / ``share_model``, the
    cell's ``regime``, its ``model_error`` and ``interval_note``."""
    out: dict[str, list[object]] = {}
    for r in rows.iter_rows(named=True):
        flights = [r.get(f"in_flight_p90_{arm}") for arm in ("off", "on")]
        busiest = None if None in flights else max(float(f) for f in flights if f is not None)
        cell = regime(closed=closed, level=r.get("load_level"), busiest=busiest)
        sigma = sigmas.get(cell, math.nan)
        out.setdefault("regime", []).append(cell)
        out.setdefault("model_error", []).append(sigma if math.isfinite(sigma) else None)
        for gain in GAINS:
            c = combine(
                r[gain], r[f"{gain}_low"], r[f"{gain}_high"], r[f"{gain}_replicates"] or [],
                drawn=drawn, sigma=sigma,
            )  # fmt: skip
            out.setdefault(f"{gain}_sampling_low", []).append(r[f"{gain}_low"])
            out.setdefault(f"{gain}_sampling_high", []).append(r[f"{gain}_high"])
            out.setdefault(f"{gain}_low", []).append(_finite(c.low))
            out.setdefault(f"{gain}_high", []).append(_finite(c.high))
            if gain == "session_gain":
                out.setdefault("share_sampling", []).append(_finite(c.share_sampling))
                out.setdefault("share_parameters", []).append(_finite(c.share_parameters))
                out.setdefault("share_model", []).append(_finite(c.share_model))
                out.setdefault("interval_note", []).append(c.note or None)
    strings = {"regime", "interval_note"}
    return rows.drop([f"{g}_replicates" for g in GAINS]).with_columns(
        *(pl.Series(k, v, dtype=pl.String if k in strings else pl.Float64) for k, v in out.items())
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
