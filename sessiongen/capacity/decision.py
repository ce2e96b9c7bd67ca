"""The plan's side of the pool decision: replicates, and ``--find``'s bisection.

- **Replicates** (:func:`replicate_sets`): a configuration runs ``seeds`` times, replicate
  ``k`` with the scenario's seed plus ``k`` (arrivals, pauses, placement draws, session
  lengths) and, when the profile file carries the fit's bootstrap draws
  (``[[fit.draw]]``, :func:`profile_draws`), draw ``k - 1``'s parameters. Replicate 0 is
  the scenario as given, so ``--seeds 1`` is the single seeded run of before.
- **Pooling, verdicts, objectives**: :mod:`sessiongen.analysis.payoff`, one reading for
  a plan and a replay (the replicates' requests pooled, units (replicate, session); the
  gain's 95% interval against ``--pays-at``; each arm's goodput against the objective).
  ``--find KEY --find-by objective`` bisects the objective's verdict, per arm, for where
  each stops meeting it.
- **Bisection** (:func:`bisect`): every region of one verdict along one numeric key.
  The range's ends and three values evenly spaced between them are planned even where
  the ends agree (a verdict that changes and changes back shows there, or the interior
  reads "not checked" where ``--find-steps`` left no room for them); then every pair of
  neighbouring planned values whose verdicts differ is halved until its ends are
  adjacent or ``--find-steps`` halvings are spent (geometric midpoints over a range of
  8x or more from a positive start, four significant digits; integer keys stop at
  adjacent integers). The regions are reported in order, a verdict that comes back or
  steps back is flagged "not monotone", and beside the verdicts' edges (which read the
  95% interval, so they move with ``--seeds``) stands where the point estimate itself
  crosses the threshold, interpolated between planned values.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessiongen.errors import UserError
from sessiongen.infra.tomlfile import read_toml
from sessiongen.scenario.spec import Scenario

#: The default ``--seeds``: three replicates per configuration (a plan of the CI's
#: scenarios stays within its minute; each seed adds a configuration's run).
DEFAULT_SEEDS = 3
#: Bisection steps per boundary (each is one plan of every configuration and seed).
DEFAULT_STEPS = 6


def profile_draws(scenario: Scenario) -> list[dict[str, object]]:
    """The fit's bootstrap draws its profile file carries (``[[fit.draw]]``, each a table
    of ``[target.sim]`` parameters), without the keys the scenario sets itself (they win
    over the profile, as its point values do); none for a profile without draws."""
    name = scenario.target.sim.profile
    if not name:
        return []
    loaded = read_toml(Path(name))
    draws = (loaded.get("fit") or {}).get("draw") or []
    if not isinstance(draws, list):
        raise UserError(f"{name}: fit.draw: expected an array of tables")
    nested = loaded.get("target", {}).get("sim", {}) if "target" in loaded else loaded
    sim = scenario.target.sim
    out: list[dict[str, object]] = []
    for draw in draws:
        # a key whose value differs from the file's point value was set by the scenario
        out.append({k: v for k, v in draw.items() if _same(getattr(sim, k, None), nested.get(k))})
    return out


def _same(value: Any, written: Any) -> bool:
    """A scenario's value is the profile file's (TOML lists load as tuples)."""
    if isinstance(written, list):
        written = tuple(written)
    return value is not None and value == written


def replicate_sets(
    k: int, base_seed: int, draws: Sequence[Mapping[str, object]], *, profile: str | None = None
) -> list[str]:
    """The ``--set`` overrides of replicate ``k`` (module doc): none for replicate 0.
    Replicate ``k`` takes draw ``k - 1`` and no draw serves twice (a reused draw would
    count one parameter set as two, and narrow the interval on nothing new): beyond the
    draws, a one-line error naming ``profile`` (the profile file)."""
    if k == 0:
        return []
    sets = [f"seed={base_seed + k}"]
    if draws:
        if k - 1 >= len(draws):
            n = len(draws)
            raise UserError(
                f"{profile or 'the profile'} carries {n} parameter draws; --seeds at most {n + 1}"
            )
        sets += [f"target.sim.{key}={_toml(value)}" for key, value in draws[k - 1].items()]
    return sets


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Region:
    """Consecutive planned values with one verdict: the first and last of them."""

    verdict: str
    low: float
    high: float

    def text(self, name: str) -> str:
        where = _n(self.low) if self.low == self.high else f"{_n(self.low)}..{_n(self.high)}"
        return f"{self.verdict} at {name}={where}"


#: Verdicts in their order of merit, per kind: along a key a monotone function's verdicts
#: never step back down this scale after stepping up (nor up after down).
RANKS = {"does not pay": 0, "pays": 2, "misses": 0, "meets": 2, "undecided": 1}


def _rank(verdict: str) -> int | None:
    """A verdict's place on :data:`RANKS`, a qualifier after a comma aside ("pays, on an
    unfitted profile" is a "pays"); None for one off the scale (unstable)."""
    return RANKS.get(verdict.split(",", 1)[0].strip())


@dataclass(frozen=True)
class Bracket:
    """Where one cell's verdict changes along a key (the module doc's bisection).

    ``points`` is every value looked at with its verdict, in the order planned; the
    ``regions`` are runs of consecutive (by value) planned values with one verdict.
    ``first``/``last`` are the verdicts at the range's ends; ``below`` is the largest
    value of the first region, ``above`` the smallest of the last (the range's ends
    when one verdict holds throughout); ``undecided`` the (lowest, highest) value seen
    undecided between them, if any. ``interior`` is how many values strictly inside the
    range the first grid planned, out of ``wanted``: fewer (``--find-steps`` ran out,
    or an integer range with no room) and the interior is not checked. ``estimates``
    holds each planned value's point estimate (the session gain, or an arm's goodput)
    where the caller gave one, and ``crossings`` where it crosses ``threshold``,
    interpolated between planned values (on a log scale where the bisection is
    geometric): the verdicts read the 95% interval, so their boundaries move with
    ``--seeds``, while the point estimate's crossing does not.
    """

    first: str
    last: str
    below: float
    above: float
    undecided: tuple[float, float] | None
    points: tuple[tuple[float, str], ...]
    interior: int = 0
    wanted: int = 0
    estimates: tuple[tuple[float, float | None], ...] = ()
    threshold: float | None = None
    crossings: tuple[float, ...] = ()

    @property
    def flips(self) -> bool:
        return self.first != self.last

    @property
    def regions(self) -> tuple[Region, ...]:
        """Runs of equal verdicts over the planned values, in increasing order."""
        out: list[Region] = []
        for x, v in sorted(self.points):
            if out and out[-1].verdict == v:
                out[-1] = Region(v, out[-1].low, x)
            else:
                out.append(Region(v, x, x))
        return tuple(out)

    @property
    def interior_checked(self) -> bool:
        return self.interior >= self.wanted

    @property
    def reversal(self) -> tuple[Region, Region] | None:
        """The first pair of regions that breaks monotonicity: a verdict that comes back
        after another, or a step against the direction taken so far on :data:`RANKS`
        (misses, then undecided at a larger value); None where the verdicts are monotone."""
        seen: set[str] = set()
        direction = 0
        last_ranked: Region | None = None
        for before, region in zip((None, *self.regions), self.regions, strict=False):
            if region.verdict in seen and before is not None:
                return before, region
            seen.add(region.verdict)
            rank = _rank(region.verdict)
            if rank is None:
                continue
            if last_ranked is not None:
                before_rank = _rank(last_ranked.verdict) or 0
                step = (rank > before_rank) - (rank < before_rank)
                if direction and step and step != direction:
                    return last_ranked, region
                direction = direction or step
            last_ranked = region
        return None

    @property
    def monotone(self) -> bool:
        return self.reversal is None

    def text(self, name: str) -> str:
        """One line: every region in order, the point estimate's crossing, the flags."""
        parts = [r.text(name) for r in self.regions]
        line = "; ".join(parts)
        if len(parts) == 1:
            line = (
                f"{self.first} over the whole range {name}={_n(self.below)}..{_n(self.above)} "
                f"({len(self.points)} values planned)"
            )
        if self.threshold is not None and self.estimates:
            if self.crossings:
                at = ", ".join(f"~{_n(x)}" for x in self.crossings)
                line += f"; point estimate crosses {_n(self.threshold)} at {name}={at}"
            else:
                line += f"; point estimate does not cross {_n(self.threshold)}"
            if len(parts) > 1:
                line += " (the verdicts read the 95% interval: their edges move with --seeds)"
        if not self.interior_checked:
            line += (
                f"; interior not checked ({self.interior} of {self.wanted} interior values "
                "planned: raise --find-steps)"
            )
        reversal = self.reversal
        if reversal is not None:
            a, b = reversal
            line += (
                f"; NOT MONOTONE: {a.verdict} at {name}={_n(a.high)} but {b.verdict} at "
                f"{name}={_n(b.low)} (the verdict is not monotone in the key: a region "
                "may lie unseen between planned values)"
            )
        return line


def _n(value: float) -> str:
    """A key's value in text: four significant digits (0.007071, not 0.007071067811865475)."""
    return f"{value:.4g}"


def _round(value: float, a: float, b: float) -> float:
    """``value`` to four significant digits, or as few more as keep it inside (a, b)."""
    for digits in (4, 6, 8, 12):
        rounded = float(f"{value:.{digits}g}")
        if a < rounded < b:
            return rounded
    return value


def _midpoint(a: float, b: float, *, integer: bool, geometric: bool) -> float | None:
    mid = math.sqrt(a * b) if geometric else (a + b) / 2
    if integer:
        mid = float(round(mid))
        if mid <= a:
            mid = a + 1
        if mid >= b:
            return None
    elif not a < mid < b:
        return None
    return mid if integer else _round(mid, a, b)


def _grid(low: float, high: float, n: int, *, integer: bool, geometric: bool) -> list[float]:
    """``n`` values evenly spaced strictly inside (low, high), on a log scale when
    ``geometric``; integers rounded and deduplicated (fewer where there is no room)."""
    out: list[float] = []
    for i in range(1, n + 1):
        f = i / (n + 1)
        x = low * (high / low) ** f if geometric else low + (high - low) * f
        x = float(round(x)) if integer else _round(x, low, high)
        if low < x < high and x not in out:
            out.append(x)
    return out


def _crossings(
    estimates: Sequence[tuple[float, float | None]], threshold: float, *, geometric: bool
) -> tuple[float, ...]:
    """Where the point estimate crosses ``threshold`` between consecutive planned values
    (linear interpolation, in log value where the bisection is geometric)."""
    known = sorted((x, g) for x, g in estimates if g is not None and math.isfinite(g))
    out = []
    for (x0, g0), (x1, g1) in itertools.pairwise(known):
        if (g0 >= threshold) == (g1 >= threshold):
            continue
        f = (threshold - g0) / (g1 - g0)
        if geometric:
            out.append(x0 * (x1 / x0) ** f)
        else:
            out.append(x0 + f * (x1 - x0))
    return tuple(out)


#: Values planned strictly inside the range before any bisection, even where both ends
#: agree (a verdict that changes and changes back between the ends shows there).
DEFAULT_INTERIOR = 3


def bisect(
    verdict_at: Callable[[float], str],
    low: float,
    high: float,
    *,
    integer: bool = False,
    steps: int = DEFAULT_STEPS,
    interior: int = DEFAULT_INTERIOR,
    estimate_at: Callable[[float], float | None] | None = None,
    threshold: float | None = None,
) -> Bracket:
    """Every region of one verdict between ``low`` and ``high``, each edge bracketed
    (module doc).

    The ends and ``min(interior, steps)`` evenly spaced values between them are planned
    first; then every pair of neighbouring planned values with different verdicts is
    halved, each new pair again, at most ``steps`` times down from the first grid.
    ``verdict_at`` (and ``estimate_at``, the point estimate read against ``threshold``
    for the crossing) is called once per value looked at (memoise it to share points
    between cells).
    """
    if not low < high:
        raise UserError(f"--find: expected LOW < HIGH, got {low:g}:{high:g}")
    geometric = low > 0 and high / low >= 8
    seen: dict[float, str] = {}
    estimates: dict[float, float | None] = {}

    def at(x: float) -> str:
        if x not in seen:
            seen[x] = verdict_at(x)
            if estimate_at is not None:
                estimates[x] = estimate_at(x)
        return seen[x]

    at(low)
    at(high)
    room = int(high - low - 1) if integer else interior
    wanted = max(0, min(interior, room))
    inside = _grid(low, high, min(interior, steps), integer=integer, geometric=geometric)
    for x in inside:
        at(x)
    ordered = sorted(seen)
    pending = deque((a, b, 0) for a, b in itertools.pairwise(ordered) if seen[a] != seen[b])
    while pending:
        a, b, depth = pending.popleft()
        mid = _midpoint(a, b, integer=integer, geometric=geometric) if depth < steps else None
        if mid is None:
            continue
        v = at(mid)
        if v != seen[a]:
            pending.append((a, mid, depth + 1))
        if v != seen[b]:
            pending.append((mid, b, depth + 1))
    first, last = seen[low], seen[high]
    points = tuple(seen.items())
    regions = Bracket(first, last, low, high, None, points).regions
    below, above = (low, high) if len(regions) == 1 else (regions[0].high, regions[-1].low)
    undecided = sorted(x for x, v in seen.items() if below < x < above and v == "undecided")
    crossings = (
        _crossings(list(estimates.items()), threshold, geometric=geometric)
        if threshold is not None
        else ()
    )
    return Bracket(
        first, last, below, above, (undecided[0], undecided[-1]) if undecided else None,
        points, interior=len(inside), wanted=wanted,
        estimates=tuple(sorted(estimates.items())), threshold=threshold, crossings=crossings,
    )  # fmt: skip


def parse_find(text: str) -> tuple[str, float, float, bool]:
    """``KEY=LOW:HIGH`` -> (key, low, high, integer: both ends written as integers)."""
    key, sep, rest = text.partition("=")
    low_s, colon, high_s = rest.partition(":")
    if not sep or not key.strip() or not colon:
        raise UserError(f"--find {text!r}: expected KEY=LOW:HIGH (e.g. target.sim.replicas=1:8)")
    try:
        low, high = float(low_s), float(high_s)
    except ValueError:
        raise UserError(f"--find {text!r}: LOW and HIGH must be numbers") from None
    if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
        raise UserError(f"--find {text!r}: expected finite LOW < HIGH")
    integer = all(_is_int(s.strip()) for s in (low_s, high_s))
    return key.strip(), low, high, integer


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def value_text(value: float, *, integer: bool) -> str:
    """A key's value as ``--set`` takes it."""
    return str(int(value)) if integer else repr(float(value))
