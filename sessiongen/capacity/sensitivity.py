"""Sensitivity at a glance: does a plan's verdict hold over what its profile does not know?

For each decision cell (configuration, placement, context, load level): the session gain
and verdict with one profile parameter at its low or its high end and every other
parameter at the profile's value. Each (configuration, parameter, end) is one planned
run, replicate 0 only (the scenario's seed, no parameter draw), through the plan's own
machinery (:func:`~sessiongen.capacity.virtual.plan_config` over
:func:`~sessiongen.capacity.sweep.run_all`, so ``--jobs`` and Ray spread the ends as they
spread the grid), written under ``PLAN/sensitivity/`` as a run folder, and reduced by the
plan's own what-if rows, :func:`~sessiongen.analysis.payoff.arm_stability` and
:func:`~sessiongen.analysis.payoff.with_verdicts`: a gain or verdict at an end means
what the cell's does
(``sensitivity.parquet``, :data:`SENSITIVITY_COLUMNS`).

- **Parameters** (:data:`PARAMETERS`): the timing terms ``sessiongen fit`` estimates,
  ``hit_overhead_s`` as a whole (every knot scaled together). One whose value is zero is
  skipped (a share of nothing is nothing: a noise-free profile stays noise-free), and so
  is one the grid varies itself (``--vary`` already shows it).
- **What an end plans**: the whole configuration, except for a parameter of the pool
  (:data:`POOL_ONLY`), which cannot move a pool-off arm: its ends plan the pool-on blocks
  alone and take the pool-off blocks' records from replicate 0, which has the same seed
  (the records a full plan gives, to the bit: ``tests/integration/test_plan_sensitivity.py``).
- **Ends** (:func:`ends`): a fitted profile's ``[fit.interval]`` table (``[target.sim]``
  key -> ``[low, high]``; ``hit_overhead_s`` -> ``[[lows...], [highs...]]``), read by
  :func:`profile_intervals`, which tolerates its absence. Where a parameter has no usable
  interval (a built-in or hand-written profile, a parameter the runs did not identify, an
  interval that does not hold the point value, or a value the scenario sets over the
  file's) the ends are the value -/+ :data:`UNFITTED_SPAN`. 10%, not 25%: it is the size
  of the planner's own measured error at one session in flight (docs/benchmarks.md's held-out
  decision table, 7-14%), so a verdict that does not survive it is not one to act on;
  each box costs two runs per parameter and configuration (16 for the study profile,
  beside the grid's ``--seeds``), so a second, wider box would double that again. A
  notebook asks for one with ``span=0.25``.
- **Reading** (:func:`judge`): an end's figures are the cell's own, moved by what the
  parameter does at one seed: the cell's session gain and its interval times the end's
  gain over replicate 0's (both planned with the scenario's seed, so the ratio is the
  parameter's effect, common random numbers, not a new draw of arrivals); an arm's
  stability is the end's where it differs from replicate 0's, the cell's otherwise. The
  verdict is :func:`~sessiongen.analysis.payoff.with_verdicts`' on those figures, so the
  interval at an
  end is as wide as the cell's (every part of it: sessions, draws, the model's error)
  and a verdict changes only because the parameter moved the gain or an arm's queue.
- **Robustness** (:func:`robustness`): a cell is *robust* when the verdict at every end
  is the cell's. Otherwise the text names each flipping parameter, its direction and
  the verdict there ("pays unless prefill_s_per_ktok is 10% below the profile's (does
  not pay there)"); a stable cell with an arm that turns unstable at an end is "near
  saturation", with that arm's TTFT growth at the end against the limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import polars as pl

from sessiongen.analysis.load import MAX_GROWTH
from sessiongen.analysis.payoff import CELL, arm_stability, with_verdicts
from sessiongen.analysis.whatif import Config, Vary
from sessiongen.capacity.sweep import SweepOptions, run_all
from sessiongen.capacity.virtual import ConfigTask, PlannedRun, Tokens, plan_config, write_run
from sessiongen.infra.files import ensure_dir
from sessiongen.infra.tomlfile import read_toml
from sessiongen.records import io
from sessiongen.records.format import BlockEntry, Manifest
from sessiongen.records.run import Run, load_run
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.scenario.spec import load as load_scenario

#: The profile parameters whose ends are planned, in the order a report lists them.
PARAMETERS = (
    "prefill_s_per_ktok",
    "attn_s_per_ktok2",
    "pool_bandwidth_gbps",
    "pool_load_fixed_s",
    "pool_store_s_per_gb",
    "hit_overhead_s",
    "itl_base_s",
    "itl_per_ktok_s",
    "itl_per_batch_s",
    "prefill_noise_sigma",
)
#: The parameters that move only the arms with the pool on: the pool's link and its
#: store cost (a pool-off replica never loads from the pool nor stores into it). An end of
#: one of them plans those arms alone and takes the pool-off blocks' records from
#: replicate 0 (the same scenario and seed, so the same records a full plan would give).
POOL_ONLY = ("pool_bandwidth_gbps", "pool_load_fixed_s", "pool_store_s_per_gb")
#: The relative half-width of the box where a parameter has no fitted interval (module doc).
UNFITTED_SPAN = 0.10
#: The folder under the plan folder that holds the ends' run folders.
FOLDER = "sensitivity"

EndName = Literal["low", "high"]
Value = float | tuple[float, ...]

#: What each column of ``sensitivity.parquet`` means (beside the cell's keys, which are
#: the what-if table's).
SENSITIVITY_COLUMNS = {
    "parameter": "the [target.sim] parameter moved (the others at the profile's values)",
    "end": "low or high end of the parameter's box",
    "source": "where the end comes from: 'fit interval' (the profile's [fit.interval]) or "
    "'+-10%' (no usable interval: the value -/+ the span)",
    "setting": "the --set that planned the end",
    "base_value": "the parameter's value in the cell's scenario (hit_overhead_s: its "
    "largest knot's)",
    "value": "the parameter's value at the end (hit_overhead_s: its largest knot's)",
    "change": "value / base_value - 1 (hit_overhead_s: of the knots' sum)",
    "gain_one": "the session gain of the end's own run (one replicate, the scenario's seed)",
    "gain_one_base": "the session gain of the cell's replicate 0 (the same seed)",
    "gain_ratio": "gain_one / gain_one_base: what the parameter's end does to the gain, "
    "the seed held (common random numbers)",
    "session_gain": "the cell's session gain times gain_ratio",
    "session_gain_low": "the cell's interval's lower end times gain_ratio",
    "session_gain_high": "the cell's interval's upper end times gain_ratio",
    "sessions": "the cell's sessions (the interval's units)",
    "stable_off": "pool off keeps up at the end: the end's run where its stability differs "
    "from replicate 0's, the cell's otherwise",
    "stable_on": "the same, pool on",
    "ttft_growth_off": "pool off: TTFT growth of the end's own run, s per s",
    "ttft_growth_on": "pool on: TTFT growth of the end's own run, s per s",
    "verdict": "the verdict on these figures (the what-if column's definition and pays_at)",
    "flips": "the end's verdict is not the cell's",
}


@dataclass(frozen=True)
class End:
    """One end of one parameter's box in one configuration."""

    parameter: str
    end: EndName
    base: Value
    value: Value
    fitted: bool  # from the profile's [fit.interval], else the span

    @property
    def change(self) -> float:
        """The relative change from the base value (of the knots' sum for a vector)."""
        base, value = _total(self.base), _total(self.value)
        return value / base - 1 if base else math.nan

    @property
    def setting(self) -> str:
        """The ``--set`` that plans this end."""
        return f"target.sim.{self.parameter}={_toml(self.value)}"

    def source(self, span: float) -> str:
        return "fit interval" if self.fitted else f"+-{span:.0%}"


def _total(value: Value) -> float:
    return float(sum(value)) if isinstance(value, tuple) else float(value)


def _last(value: Value) -> float:
    return float(value[-1]) if isinstance(value, tuple) else float(value)


def _toml(value: Value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(repr(float(v)) for v in value) + "]"
    return repr(float(value))


def profile_intervals(sim: SimProfile) -> dict[str, tuple[Value, Value]]:
    """The usable ``[fit.interval]`` entries of the scenario's profile file (module doc):
    each holds the scenario's value between its ends, and the scenario's value is the
    file's (a key the scenario sets itself is not the fit's). Empty without a profile
    file, without the table, or where an entry is not ``[low, high]``."""
    if not sim.profile:
        return {}
    loaded = read_toml(Path(sim.profile))
    fit = loaded.get("fit")
    table = fit.get("interval") if isinstance(fit, dict) else None
    if not isinstance(table, dict):
        return {}
    nested = loaded.get("target", {}).get("sim", {}) if "target" in loaded else loaded
    out: dict[str, tuple[Value, Value]] = {}
    for key, pair in table.items():
        value = getattr(sim, key, None)
        written = nested.get(key)
        written = tuple(written) if isinstance(written, list) else written
        if key not in PARAMETERS or value is None or value != written:
            continue
        ends = _interval(pair, value)
        if ends is not None:
            out[key] = ends
    return out


def _interval(pair: Any, value: Value) -> tuple[Value, Value] | None:
    """``pair`` as (low, high) shaped like ``value`` and holding it; None otherwise."""
    if not isinstance(pair, list) or len(pair) != 2:
        return None
    if isinstance(value, tuple):
        if not all(isinstance(p, list) and len(p) == len(value) for p in pair):
            return None
        low, high = (tuple(float(x) for x in p) for p in pair)
        points = zip(low, value, high, strict=True)
        ok = all(_finite(a, b) and 0 <= a <= v <= b for a, v, b in points)
        return (low, high) if ok else None
    if not all(isinstance(p, int | float) for p in pair):
        return None
    low_f, high_f = float(pair[0]), float(pair[1])
    ok = _finite(low_f, high_f) and 0 <= low_f <= value <= high_f and low_f < high_f
    return (low_f, high_f) if ok else None


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def ends(
    sim: SimProfile,
    *,
    span: float = UNFITTED_SPAN,
    skip: Sequence[str] = (),
    parameters: Sequence[str] = PARAMETERS,
) -> list[End]:
    """Both ends of each of ``parameters`` (in :data:`PARAMETERS`' order) that is not zero
    in ``sim`` and not in ``skip``: the profile's fitted interval where usable, else
    ``value * (1 -/+ span)`` (module doc)."""
    intervals = profile_intervals(sim)
    out = []
    for name in (p for p in PARAMETERS if p in parameters):
        base: Value = getattr(sim, name)
        if name in skip or _total(base) == 0:
            continue
        if name in intervals:
            low, high = intervals[name]
            fitted = True
        else:
            low, high = _scaled(base, 1 - span), _scaled(base, 1 + span)
            fitted = False
        if name == "pool_bandwidth_gbps" and _total(low) <= 0:  # it must stay above zero
            low, high, fitted = _scaled(base, 1 - span), _scaled(base, 1 + span), False
        out += [End(name, "low", base, low, fitted), End(name, "high", base, high, fitted)]
    return out


def _scaled(value: Value, factor: float) -> Value:
    if isinstance(value, tuple):
        return tuple(v * factor for v in value)
    return value * factor


def end_folder(config: Config, end: End) -> str:
    """An end's run folder under ``PLAN/sensitivity/``."""
    return f"{config.folder}.{end.parameter}-{end.end}"


#: The plan's per-arm what-if rows of one run (:func:`sessiongen.capacity.plan.whatif_rows`,
#: handed in: the planner calls this module, so it cannot import the planner).
Rows = Callable[[Run], pl.DataFrame]


def reduce_run(run: Run, rows: Rows) -> pl.DataFrame:
    """Per cell of one planned run: its session gain (``gain_one``), each arm's
    stability and TTFT growth, as the plan reduces a configuration's replicates."""
    row = rows(run).join(arm_stability([run]), on=CELL, how="left", nulls_equal=True)
    return row.select(
        *CELL,
        pl.col("session_gain").alias("gain_one"),
        *(f"{k}_{arm}" for k in ("stable", "ttft_growth") for arm in ("off", "on")),
    )


def plan_ends(
    path: str | Path,
    overrides: Sequence[str],
    varies: Sequence[Vary],
    grid: Sequence[Config],
    out: Path,
    *,
    rows: Rows,
    tokens: Tokens = "auto",
    sweep: SweepOptions | None = None,
    span: float = UNFITTED_SPAN,
    parameters: Sequence[str] = PARAMETERS,
    on_done: Callable[[Config, Path], None] | None = None,
) -> pl.DataFrame:
    """Plan every end of every configuration of ``grid`` (module doc; ``parameters``
    narrows the box's dimensions); per cell and end, the end (parameter, values) and
    :func:`reduce_run`'s figures of its run."""
    sweep = sweep or SweepOptions()
    varied = [v.key.removeprefix("target.sim.") for v in varies]
    pairs: list[tuple[Config, End]] = []
    tasks = []
    for config in grid:
        sets = [*overrides, *(f"{k}={v}" for k, v in config.values.items())]
        planned_off = pool_off_blocks(out, config)
        for end in ends(config.scenario.target.sim, span=span, skip=varied, parameters=parameters):
            scenario = load_scenario(path, [*sets, end.setting])
            pairs.append((config, end))
            skip = planned_off if end.parameter in POOL_ONLY else ()
            tasks.append(ConfigTask(scenario, end_folder(config, end), tokens, False, skip))
    folders: dict[int, Path] = {}

    def finished(i: int, planned: PlannedRun) -> None:
        config, end = pairs[i]
        if tasks[i].skip:
            planned = with_blocks_of(planned, out / "configs" / config.folder, tasks[i].skip)
        folders[i] = write_run(out / FOLDER / end_folder(config, end), planned)
        if on_done is not None:
            on_done(config, folders[i])

    if tasks:
        ensure_dir(out / FOLDER)
    run_all(plan_config, tasks, sweep, finished)
    frames = []
    for i, (config, end) in enumerate(pairs):  # in grid order, whatever finished first
        frames.append(
            reduce_run(load_run(folders[i]), rows).with_columns(
                pl.lit(config.index).alias("config"),
                pl.lit(end.parameter).alias("parameter"),
                pl.lit(end.end).alias("end"),
                pl.lit(end.source(span)).alias("source"),
                pl.lit(end.setting).alias("setting"),
                pl.lit(_last(end.base)).alias("base_value"),
                pl.lit(_last(end.value)).alias("value"),
                pl.lit(end.change).alias("change"),
            )
        )
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames, how="diagonal_relaxed")


def pool_off_blocks(out: Path, config: Config) -> tuple[tuple[int, float], ...]:
    """Replicate 0's pool-off blocks of ``config`` (planned already, under
    ``out/configs``), each with its modeled seconds: what an end of a :data:`POOL_ONLY`
    parameter need not plan again."""
    manifest = io.read_manifest(out / "configs" / config.folder)
    return tuple(
        (int(b["block"]), float(b["modeled_s"])) for b in manifest["blocks"] if b["cache"] == "off"
    )


def with_blocks_of(
    planned: PlannedRun, folder: Path, blocks: Sequence[tuple[int, float]]
) -> PlannedRun:
    """``planned`` with the records and manifest entries of ``blocks`` taken from the run
    folder ``folder`` (under ``planned``'s run id), in block order; each such entry says
    where it came from (``source_run``, ``source_block``, as a merged run's do)."""
    numbers = [b for b, _ in blocks]
    run_id = planned.manifest["run_id"]
    source = io.read_manifest(folder)
    theirs = (
        pl.read_parquet(folder / "requests.parquet")
        .filter(pl.col("block").is_in(numbers))
        .with_columns(pl.lit(run_id).alias("run_id"))
    )
    requests = pl.concat([planned.requests, theirs.select(planned.requests.columns)])
    requests = requests.sort("block", maintain_order=True)
    entries: list[BlockEntry] = [
        {**entry, "source_run": source["run_id"], "source_block": entry["block"]}
        for entry in source["blocks"]
        if entry["block"] in numbers
    ]
    manifest = dict(planned.manifest)
    manifest["blocks"] = sorted([*planned.manifest["blocks"], *entries], key=_block_number)
    return PlannedRun(cast(Manifest, manifest), requests)


def _block_number(entry: BlockEntry) -> int:
    return entry["block"]


def replicate_zero(grid: Sequence[Config], out: Path, rows: Rows) -> pl.DataFrame:
    """Per cell: replicate 0's own figures (``configs/NN-label``, planned already, with
    the seed every end plans with), ``_base``-suffixed: what an end is read against."""
    frames = []
    for config in grid:
        reduced = reduce_run(load_run(out / "configs" / config.folder), rows)
        frames.append(
            reduced.rename({c: f"{c}_base" for c in reduced.columns if c not in CELL})
            .select(*CELL, "gain_one_base", "stable_off_base", "stable_on_base")
            .with_columns(pl.lit(config.index).alias("config"))
        )
    return pl.concat(frames, how="diagonal_relaxed")


#: What each end's row carries from the cell (its estimate, interval, units, verdict).
_CELL_FIGURES = ("session_gain", "session_gain_low", "session_gain_high", "sessions")


def judge(
    whatif: pl.DataFrame, raw: pl.DataFrame, zero: pl.DataFrame, varies: Sequence[Vary] = ()
) -> pl.DataFrame:
    """Each end read as the cell's own estimate moved by the parameter (module doc): the
    cell's session gain and interval times ``gain_ratio`` (the end's gain over replicate
    0's, one seed: common random numbers), each arm's stability the end's where it
    differs from replicate 0's and the cell's otherwise; the verdict from
    :func:`~sessiongen.analysis.payoff.with_verdicts` at the cell's ``pays_at``; ``flips``
    where it is not
    the cell's. Rows in :data:`SENSITIVITY_COLUMNS` order, keyed as the what-if table."""
    keys = ["config", *CELL]
    front = ["label", *(v.key for v in varies)]
    cells = whatif.select(
        *keys,
        *front,
        *_CELL_FIGURES,
        pl.col("verdict").alias("cell_verdict"),
        pl.col("stable_off").alias("cell_stable_off"),
        pl.col("stable_on").alias("cell_stable_on"),
    )
    frame = raw.join(cells, on=keys, how="inner", nulls_equal=True).join(
        zero, on=keys, how="left", nulls_equal=True
    )
    ratio = pl.col("gain_one") / pl.col("gain_one_base")
    frame = frame.with_columns(
        ratio.alias("gain_ratio"),
        *(pl.col(c) * ratio for c in _CELL_FIGURES[:3]),
        *(
            pl.when(pl.col(f"stable_{arm}") == pl.col(f"stable_{arm}_base"))
            .then(pl.col(f"cell_stable_{arm}"))
            .otherwise(pl.col(f"stable_{arm}"))
            .alias(f"stable_{arm}")
            for arm in ("off", "on")
        ),
    )
    pays_at = float(whatif["pays_at"][0])
    frame = with_verdicts(frame, pays_at).with_columns(
        (pl.col("verdict") != pl.col("cell_verdict")).fill_null(False).alias("flips")
    )
    return frame.select("config", *front, *CELL, *SENSITIVITY_COLUMNS)


@dataclass(frozen=True)
class EndReading:
    """One end of one parameter in one cell as :func:`robustness` reads it (a row of
    :func:`judge`'s frame)."""

    parameter: str
    end: str  # low | high
    change: float | None  # against the profile's value
    source: str  # where the end comes from: "fit interval", or the default box
    verdict: str
    flips: bool
    growth: tuple[tuple[str, float], ...] = ()  # (arm, TTFT growth) of arms unstable there


def with_robustness(whatif: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """``whatif`` with ``robustness`` and ``sensitive_to`` per cell (:func:`robustness`)
    from its ends in ``frame`` (:func:`judge`'s)."""
    keys = ["config", *CELL]
    by_cell: dict[tuple[object, ...], list[EndReading]] = {}
    for row in frame.iter_rows(named=True):
        growth = tuple(
            (arm, float(row[f"ttft_growth_{arm}"]))
            for arm in ("off", "on")
            if row.get(f"stable_{arm}") is False and row.get(f"ttft_growth_{arm}") is not None
        )
        reading = EndReading(
            parameter=str(row["parameter"]),
            end=str(row["end"]),
            change=row["change"],
            source=str(row["source"]),
            verdict=str(row["verdict"]),
            flips=bool(row["flips"]),
            growth=growth,
        )
        by_cell.setdefault(tuple(row[k] for k in keys), []).append(reading)
    texts, names = [], []
    for row in whatif.iter_rows(named=True):
        cell = by_cell.get(tuple(row[k] for k in keys), [])
        text, sensitive = robustness(str(row["verdict"]), cell)
        texts.append(text)
        names.append(sensitive)
    return whatif.with_columns(
        pl.Series("robustness", texts, dtype=pl.String),
        pl.Series("sensitive_to", names, dtype=pl.String),
    )


def robustness(verdict: str, ends: Sequence[EndReading]) -> tuple[str, str | None]:
    """A cell's reading over its box (module doc): the text and the comma-joined names of
    the parameters that flip its verdict (None when none does). ``ends`` are its rows of
    :func:`judge`'s frame."""
    if not ends:
        return "not checked: no profile parameter to move", None
    flipping = [e for e in ends if e.flips]
    if not flipping:
        count = len({e.parameter for e in ends})
        sources = ", ".join(sorted({e.source for e in ends}))
        return f"robust: {verdict} at both ends of {count} parameters ({sources})", None
    unstable = any(e.verdict.startswith("unstable") for e in flipping)
    lead = "near saturation: " if unstable and not verdict.startswith("unstable") else ""
    text = f"{lead}{verdict} unless " + "; or ".join(_clause(e) for e in flipping)
    return text, ", ".join(dict.fromkeys(e.parameter for e in flipping))


def _clause(end: EndReading) -> str:
    """``prefill_s_per_ktok is 10% below the profile's (does not pay there)``."""
    change = end.change
    if change is None or not math.isfinite(change):
        where = f"at its {end.end} end"
    else:
        direction = "below" if change < 0 else "above"
        where = f"{abs(change) * 100:.3g}% {direction} the profile's"
    if end.source == "fit interval":
        where += f" (its fitted interval's {end.end} end)"
    there = f"{end.verdict} there"
    if end.verdict.startswith("unstable"):
        there += "".join(
            f"; {arm.upper()} TTFT grows {growth:.3g} s/s, limit {MAX_GROWTH:g}"
            for arm, growth in end.growth
        )
    return f"{end.parameter} is {where} ({there})"


def sensitivity(
    path: str | Path,
    overrides: Sequence[str],
    varies: Sequence[Vary],
    grid: Sequence[Config],
    out: Path,
    whatif: pl.DataFrame,
    *,
    rows: Rows,
    tokens: Tokens = "auto",
    sweep: SweepOptions | None = None,
    span: float = UNFITTED_SPAN,
    parameters: Sequence[str] = PARAMETERS,
    on_done: Callable[[Config, Path], None] | None = None,
) -> pl.DataFrame:
    """Plan the ends of every configuration (:func:`plan_ends`), read them
    (:func:`judge`), write ``out/sensitivity.parquet`` and return ``whatif`` (with its
    verdicts) with ``robustness`` and ``sensitive_to`` (:func:`with_robustness`)."""
    raw = plan_ends(
        path, overrides, varies, grid, out, rows=rows, tokens=tokens, sweep=sweep, span=span,
        parameters=parameters, on_done=on_done,
    )  # fmt: skip
    if raw.is_empty():
        frame = pl.DataFrame(schema={k: pl.String for k in SENSITIVITY_COLUMNS})
    else:
        frame = judge(whatif, raw, replicate_zero(grid, out, rows), varies)
    io.atomic_write_parquet(out / "sensitivity.parquet", frame)
    return with_robustness(whatif, frame)


def console_lines(whatif: pl.DataFrame) -> list[str]:
    """The robustness of each what-if row, one line each under a heading; none for a
    table planned without sensitivity."""
    if "robustness" not in whatif.columns:
        return []
    lines = ["Sensitivity (PLANNED): each verdict at both ends of every profile parameter's box"]
    for r in whatif.iter_rows(named=True):
        where = [str(r["placement"])]
        trace = r.get("unit") == "time block"  # a trace's context and level are unused
        if not trace and r.get("context_tokens") is not None:
            where.append(f"context {r['context_tokens']}")
        if not trace and r.get("load_level") is not None:
            where.append(f"level {r['load_level']:g}")
        lines.append(f"  {r['label']}; {', '.join(where)}: {r['robustness']}")
    return lines
