"""The pool decision: replicates pooled, verdicts against ``--pays-at``, and ``--find``.

- **Replicates** (:func:`replicate_sets`): a configuration runs ``seeds`` times, replicate
  ``k`` with the scenario's seed plus ``k`` (arrivals, pauses, placement draws, session
  lengths) and, when the profile file carries the fit's bootstrap draws
  (``[[fit.draw]]``, :func:`profile_draws`), draw ``k - 1``'s parameters. Replicate 0 is
  the scenario as given, so ``--seeds 1`` is the single seeded run of before.
- **Pooling** (:func:`pooled`): the replicates' requests as one run whose units are
  (replicate, session): the session gain's interval is then replay's paired session
  bootstrap (:func:`sessiongen.analysis.latency.session_speedup`: 95% expanded percentile,
  Hesterberg 2015) over every session of every replicate. The spread between seeds and
  parameter draws is in it as far as it shows in the sessions' times; the per-replicate
  range is reported beside it.
- **Verdict** (:func:`verdict`): "pays" when the whole 95% interval of the gain lies at
  or above the threshold, "does not pay" when wholly below, "undecided" when it
  straddles it (each side a one-sided test at 2.5%, as :func:`sessiongen.analysis.stats.
  decide_ratio` reads an interval). Where either cache arm is **unstable** at the
  cell's level (:func:`sessiongen.analysis.load.load_table`'s ``stable`` on the
  replicates' records pooled, :func:`arm_stability`), its queue grows with the run and
  the gain depends on the run's length: the verdict is "unstable (OFF queue grows)"
  (or ON, or both) instead, whatever the interval says.
- **Objective** (:func:`objective_verdict`): per cache arm, "meets" when the whole 95%
  interval of its goodput (share of turns within ``objective.ttft_s``, sessions the
  clusters) lies at or above ``objective.attainment``, "misses" when wholly below or the
  arm is unstable (its queue grows: no share holds for a longer run), "undecided"
  otherwise or below the pooled sessions a verdict needs. ``--find KEY --find-by
  objective`` bisects this, per arm, for where each stops meeting the objective.
- **Bisection** (:func:`bisect`): where a verdict changes along one numeric key, on a
  function assumed monotone there: first the last value with the low end's verdict,
  then (when an undecided region lies between) the first with the high end's, each
  halving its bracket (geometric midpoints over a range of 8x or more from a positive
  start; integer keys stop when the bracket's ends are adjacent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import polars as pl

from sessiongen.analysis.load import LEVEL_KEYS, load_table
from sessiongen.analysis.stats import MIN_SESSIONS
from sessiongen.errors import UserError
from sessiongen.infra.tomlfile import read_toml
from sessiongen.records.run import Run
from sessiongen.scenario.spec import Scenario

Verdict = Literal["pays", "does not pay", "undecided"]
ObjectiveVerdict = Literal["meets", "misses", "undecided"]
VERDICTS: tuple[Verdict, ...] = ("does not pay", "undecided", "pays")
#: The verdict of a cell whose OFF, ON or both arms are unstable (module doc).
UNSTABLE_VERDICTS = {
    (False, True): "unstable (OFF queue grows)",
    (True, False): "unstable (ON queue grows)",
    (False, False): "unstable (both queues grow)",
}
#: The default threshold of ``--pays-at``: a 10% shorter session.
DEFAULT_PAYS_AT = 1.1
#: The default ``--seeds``: three replicates per configuration (a plan of the CI's
#: scenarios stays within its minute; each seed adds a configuration's run).
DEFAULT_SEEDS = 3
#: Replicate ``k``'s session indices are ``k * STRIDE + index`` in a pooled run.
STRIDE = 1_000_000
#: Bisection steps per boundary (each is one plan of every configuration and seed).
DEFAULT_STEPS = 6


def verdict(low: float | None, high: float | None, pays_at: float) -> Verdict:
    """The gain's interval ``[low, high]`` against ``pays_at`` (module doc); a missing
    or NaN bound is "undecided"."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if low >= pays_at:
        return "pays"
    if high < pays_at:
        return "does not pay"
    return "undecided"


def objective_verdict(
    low: float | None, high: float | None, attainment: float, *, stable: bool | None = True
) -> ObjectiveVerdict:
    """One arm's goodput interval ``[low, high]`` against ``attainment`` (module doc); an
    unstable arm misses, a missing or NaN bound is "undecided"."""
    if stable is False:
        return "misses"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if low >= attainment:
        return "meets"
    if high < attainment:
        return "misses"
    return "undecided"


def profile_draws(scenario: Scenario) -> list[dict[str, Any]]:
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
    out = []
    for draw in draws:
        # a key whose value differs from the file's point value was set by the scenario
        out.append({k: v for k, v in draw.items() if _same(getattr(sim, k, None), nested.get(k))})
    return out


def _same(value: Any, written: Any) -> bool:
    """A scenario's value is the profile file's (TOML lists load as tuples)."""
    if isinstance(written, list):
        written = tuple(written)
    return value is not None and value == written


def replicate_sets(k: int, base_seed: int, draws: Sequence[dict[str, Any]]) -> list[str]:
    """The ``--set`` overrides of replicate ``k`` (module doc): none for replicate 0."""
    if k == 0:
        return []
    sets = [f"seed={base_seed + k}"]
    if draws:
        draw = draws[(k - 1) % len(draws)]
        sets += [f"target.sim.{key}={_toml(value)}" for key, value in draw.items()]
    return sets


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def pooled(runs: Sequence[Run], *, blocks_apart: bool = False) -> Run:
    """The replicates' requests as one run, units (replicate, session) (module doc);
    with ``blocks_apart``, replicate ``k``'s blocks numbered ``k * STRIDE + block`` (one
    block's span is then one replicate's, as a throughput needs)."""
    frames = []
    for k, run in enumerate(runs):
        frame = run.requests.with_columns(
            (pl.col("session_index") + k * STRIDE).alias("session_index"),
            (pl.lit(f"r{k}:") + pl.col("session_id").cast(pl.String)).alias("session_id"),
        )
        if blocks_apart:
            frame = frame.with_columns((pl.col("block").cast(pl.Int64) + k * STRIDE).alias("block"))
        frames.append(frame)
    return replace(runs[0], requests=pl.concat(frames, how="diagonal_relaxed"))


#: The keys of a what-if cell (a cache arm's are these and ``cache``).
CELL = [k for k in LEVEL_KEYS if k != "cache"]


def arm_stability(runs: Sequence[Run]) -> pl.DataFrame:
    """Per cell (placement, context, level): ``stable_off`` / ``stable_on`` and
    ``ttft_growth_off`` / ``ttft_growth_on``, the replay's load table's ``stable`` and
    ``ttft_growth`` (:func:`sessiongen.analysis.load.load_table`, its definition
    unchanged) on the replicates' records pooled, each replicate's blocks apart."""
    table = load_table(pooled(runs, blocks_apart=True), None)
    out = table.select(*CELL).unique()
    for cache in ("off", "on"):
        arm = table.filter(pl.col("cache") == cache).select(
            *CELL,
            pl.col("stable").alias(f"stable_{cache}"),
            pl.col("ttft_growth").alias(f"ttft_growth_{cache}"),
        )
        out = out.join(arm, on=CELL, how="left", nulls_equal=True)
    return out.sort(CELL)


def unstable_verdict(stable_off: bool | None, stable_on: bool | None) -> str | None:
    """The verdict of a cell with an unstable arm (None: both stable, or not known)."""
    return UNSTABLE_VERDICTS.get((stable_off is not False, stable_on is not False))


def with_verdicts(whatif: pl.DataFrame, pays_at: float) -> pl.DataFrame:
    """``whatif`` with ``pays_at`` and each row's ``verdict`` on its session gain;
    "undecided" below :data:`~sessiongen.analysis.stats.MIN_SESSIONS` pooled sessions,
    where the interval covers far less than it says (more ``--seeds`` decide); an
    unstable verdict where ``stable_off`` or ``stable_on`` is false (module doc). With
    an objective (``attainment`` set), ``objective_off`` and ``objective_on`` too."""
    rows = list(whatif.iter_rows(named=True))
    enough = [(r.get("sessions") or MIN_SESSIONS) >= MIN_SESSIONS for r in rows]
    verdicts = [
        unstable_verdict(r.get("stable_off"), r.get("stable_on"))
        or (verdict(r["session_gain_low"], r["session_gain_high"], pays_at) if ok else "undecided")
        for r, ok in zip(rows, enough, strict=True)
    ]
    objectives = {
        f"objective_{arm}": [
            None
            if r.get("attainment") is None
            else objective_verdict(
                r.get(f"good_turns_{arm}_low") if ok else None,
                r.get(f"good_turns_{arm}_high") if ok else None,
                r["attainment"],
                stable=r.get(f"stable_{arm}"),
            )
            for r, ok in zip(rows, enough, strict=True)
        ]
        for arm in ("off", "on")
    }
    return whatif.with_columns(
        pl.lit(pays_at).alias("pays_at"),
        pl.Series("verdict", verdicts, dtype=pl.String),
        *(pl.Series(name, values, dtype=pl.String) for name, values in objectives.items()),
    )


@dataclass(frozen=True)
class Bracket:
    """Where one cell's verdict changes along a key.

    ``below`` is the largest value seen with the low end's verdict ``first``, ``above``
    the smallest with the high end's ``last``; ``undecided`` the (lowest, highest) value
    seen undecided between them, if any. ``points`` is every value looked at, in order.
    ``flips`` is False when both ends give one verdict (nothing to bracket).
    """

    first: str
    last: str
    below: float
    above: float
    undecided: tuple[float, float] | None
    points: tuple[tuple[float, str], ...]

    @property
    def flips(self) -> bool:
        return self.first != self.last

    def text(self, name: str) -> str:
        """One line: the bracket in words."""
        if not self.flips:
            return f"{self.first} over the whole range [{_n(self.below)}, {_n(self.above)}]"
        line = f"{self.first} at {name}={_n(self.below)}, {self.last} at {name}={_n(self.above)}"
        if self.undecided is not None:
            low, high = self.undecided
            region = _n(low) if low == high else f"{_n(low)}..{_n(high)}"
            line += f"; undecided at {region}"
        return line


def _n(value: float) -> str:
    return f"{value:g}"


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
    return mid


def bisect(
    verdict_at: Callable[[float], str],
    low: float,
    high: float,
    *,
    integer: bool = False,
    steps: int = DEFAULT_STEPS,
) -> Bracket:
    """Bracket where ``verdict_at`` changes between ``low`` and ``high`` (module doc).

    ``verdict_at`` is called once per value looked at (memoise it to share points
    between cells); ``steps`` bounds the halvings of each boundary.
    """
    if not low < high:
        raise UserError(f"--find: expected LOW < HIGH, got {low:g}:{high:g}")
    geometric = low > 0 and high / low >= 8
    seen: dict[float, str] = {}

    def at(x: float) -> str:
        if x not in seen:
            seen[x] = verdict_at(x)
        return seen[x]

    first, last = at(low), at(high)
    if first == last:
        return Bracket(first, last, low, high, None, tuple(seen.items()))

    def edge(a: float, b: float, inside: Callable[[str], bool]) -> tuple[float, float]:
        """Halve [a, b] keeping inside(a) and not inside(b)."""
        for _ in range(steps):
            mid = _midpoint(a, b, integer=integer, geometric=geometric)
            if mid is None:
                break
            a, b = (mid, b) if inside(at(mid)) else (a, mid)
        return a, b

    below, b = edge(low, high, lambda v: v == first)
    above = b
    if at(b) != last:  # an undecided region lies between the two verdicts
        # from the closest value already planned with the high end's verdict
        known = min(x for x, v in seen.items() if x > b and v == last)
        _c, above = edge(b, known, lambda v: v != last)
    undecided = sorted(x for x, v in seen.items() if below < x < above and v == "undecided")
    region = (undecided[0], undecided[-1]) if undecided else None
    return Bracket(first, last, below, above, region, tuple(seen.items()))


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
