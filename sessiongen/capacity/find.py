"""Where the answer flips: ``sessiongen plan SCENARIO --find KEY=LOW:HIGH``.

Each value looked at is a plan of its own (every ``--vary`` configuration, ``--seeds``
replicates, verdicts against ``--pays-at``: :mod:`.plan`, :mod:`.decision`), its runs in
``configs/NN-<key>=<value>...``; :func:`~sessiongen.capacity.decision.bisect` chooses the
values, per cell (varied values, placement, context, load level), sharing every value
already planned. The find folder ``runs/find-<scenario>-<time>/`` holds the runs,
``whatif.parquet`` (every value's rows, the key a column), ``brackets.parquet`` (per cell:
the verdicts at the range's ends, the last value with the first, the first with the
last, the undecided values between, every region of one verdict in order, whether the
verdicts are monotone and the interior was checked, and where the point estimate crosses
the threshold) and ``report/``, whose headline is the brackets.

``by="objective"`` (``--find-by objective``) bisects each cache arm's objective verdict
(meets / misses / undecided, :func:`~sessiongen.capacity.decision.objective_verdict`)
instead of the pool's: per cell and arm, where it stops meeting ``[objective]`` (the
load or size the pool lets the deployment reach is the ON arm's bracket beside OFF's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from sessiongen.analysis.payoff import ARM, DEFAULT_PAYS_AT, with_verdicts
from sessiongen.analysis.whatif import Config, Vary
from sessiongen.capacity.decision import (
    DEFAULT_SEEDS,
    DEFAULT_STEPS,
    Bracket,
    bisect,
    parse_find,
    value_text,
)
from sessiongen.capacity.grid import configs
from sessiongen.capacity.plan import check_decision, new_plan_folder, run_grid
from sessiongen.capacity.sweep import SweepOptions
from sessiongen.capacity.virtual import Tokens
from sessiongen.errors import UserError
from sessiongen.records import io
from sessiongen.report.document import Element, Heading, Paragraph, Table
from sessiongen.report.whatif import whole_levels, write_whatif_report

FindBy = Literal["verdict", "objective"]
#: The cell key a find key sets itself (its rows move with the value, so it names no cell).
MOVES = {"load.levels": "load_level", "sessions.initial_context_tokens": "context_tokens"}


@dataclass(frozen=True)
class Found:
    """A finished ``--find``: its folder, the key, each cell's bracket."""

    out: Path
    key: str
    cells: list[tuple[dict[str, object], Bracket]]
    integer: bool = False  # the key's values are integers
    by: FindBy = "verdict"

    def lines(self) -> list[str]:
        """One line per cell: its keys, then its bracket (every region, in order); by
        objective, then per cell where each arm meets the objective."""
        name = self.key.rsplit(".", 1)[-1]
        out = []
        for cell, bracket in self.cells:
            out.append(f"{_where(cell)}: {bracket.text(name)}")
        if self.by == "objective":
            out += self._meets_lines(name)
        return out

    def _meets_lines(self, name: str) -> list[str]:
        """Per cell: the planned values where each arm meets the objective."""
        arms: dict[str, dict[str, str]] = {}
        for cell, bracket in self.cells:
            rest = {k: v for k, v in cell.items() if k != "cache"}
            meets = [r for r in bracket.regions if r.verdict == "meets"]
            text = ", ".join(r.text(name).removeprefix("meets at ") for r in meets) or "nowhere"
            arms.setdefault(_where(rest), {})[str(cell.get("cache"))] = text
        return [
            f"{where or 'as given'}: meets the objective: "
            + "; ".join(f"cache {arm} at {text}" for arm, text in texts.items())
            for where, texts in arms.items()
        ]


def _where(cell: Mapping[str, object]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {_text(v)}" for k, v in cell.items())


def _text(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def find(
    path: str | Path,
    spec: str,
    *,
    overrides: Sequence[str] = (),
    varies: Sequence[Vary] = (),
    runs_dir: Path = Path("runs"),
    tokens: Tokens = "auto",
    sweep: SweepOptions | None = None,
    seeds: int = DEFAULT_SEEDS,
    pays_at: float = DEFAULT_PAYS_AT,
    steps: int = DEFAULT_STEPS,
    on_point: Callable[[float, pl.DataFrame], None] | None = None,
    by: FindBy = "verdict",
) -> Found:
    """Bisect ``spec``'s key (``KEY=LOW:HIGH``) per cell for where its verdict (or, ``by``
    objective, each arm's objective verdict) changes (module doc); ``on_point(value,
    rows)`` as each value's plan finishes."""
    sweep = sweep or SweepOptions()
    sweep.check()
    check_decision(seeds, pays_at)
    key, low, high, integer = parse_find(spec)
    if key in {v.key for v in varies}:
        raise UserError(f"--find {key}: the key is also in --vary; give it to one of them")
    first_grid = configs(path, [*overrides, f"{key}={value_text(low, integer=integer)}"], varies)
    if by == "objective" and first_grid[0].scenario.objective.ttft_s is None:
        raise UserError(f"--find-by objective: {path}: objective.ttft_s is not set")
    out = new_plan_folder(runs_dir, "find", first_grid[0].scenario.name)
    planned: dict[float, tuple[pl.DataFrame, pl.DataFrame, list[Config]]] = {}

    def evaluate(x: float) -> pl.DataFrame:
        if x not in planned:
            text = value_text(x, integer=integer)
            point = [Vary(key, (text,)), *varies]
            whatif, turns = run_grid(
                path, overrides, point, out, tokens=tokens, progress=False, sweep=sweep,
                on_config=None, seeds=seeds,
            )  # fmt: skip
            whatif = with_verdicts(whatif, pays_at).with_columns(pl.lit(x).alias("find_value"))
            planned[x] = (whatif, turns, configs(path, overrides, point))
            if on_point is not None:
                on_point(x, whatif)
        return planned[x][0]

    cell_keys = [k for k in (*(v.key for v in varies), *ARM) if k != MOVES.get(key)]
    cells: list[dict[str, object]] = [
        dict(zip(cell_keys, k, strict=True)) for k in evaluate(low).select(cell_keys).rows()
    ]
    if by == "objective":
        cells = [{**cell, "cache": arm} for cell in cells for arm in ("off", "on")]
    found: list[tuple[dict[str, object], Bracket]] = []
    for cell in cells:

        def row(x: float, cell: dict[str, object] = cell) -> dict[str, Any] | None:
            keys = {k: v for k, v in cell.items() if k != "cache"}
            rows = evaluate(x).filter(*(pl.col(k) == v for k, v in keys.items()))
            return rows.row(0, named=True) if rows.height else None

        arm = cell.get("cache")
        column, estimate = (
            ("verdict", "session_gain") if arm is None else
            (f"objective_{arm}", f"good_turns_{arm}")
        )  # fmt: skip

        def verdict_at(x: float, column: str = column) -> str:
            r = row(x)
            return str(r[column]) if r and r[column] else "undecided"

        def estimate_at(x: float, estimate: str = estimate) -> float | None:
            r = row(x)
            return r.get(estimate) if r else None

        threshold = pays_at if arm is None else evaluate(low)["attainment"][0]
        found.append(
            (cell, bisect(verdict_at, low, high, integer=integer, steps=steps,
                          estimate_at=estimate_at, threshold=threshold))
        )  # fmt: skip
    result = Found(out, key, found, integer, by)
    _write(result, planned, varies, seeds)
    return result


def brackets_frame(found: Found) -> pl.DataFrame:
    """Per cell: its keys, the verdicts at the ends, the bracket (module doc)."""
    rows = []
    for cell, b in found.cells:
        low, high = b.undecided or (None, None)
        name = found.key.rsplit(".", 1)[-1]
        rows.append(
            {**cell, "first_verdict": b.first, "last_verdict": b.last, "flips": b.flips,
             "below": b.below, "above": b.above, "undecided_low": low,
             "undecided_high": high, "values_planned": len(b.points),
             "regions": " | ".join(r.text(name) for r in b.regions),
             "monotone": b.monotone, "interior_checked": b.interior_checked,
             "point_crossing": float(f"{b.crossings[0]:.4g}") if b.crossings else None}
        )  # fmt: skip
    return pl.DataFrame(rows)


def _whole_values(frame: pl.DataFrame, integer: bool) -> pl.DataFrame:
    if not integer:
        return frame
    cols = ("below", "above", "undecided_low", "undecided_high")
    return frame.with_columns(pl.col(c).cast(pl.Int64) for c in cols if c in frame.columns)


def _write(
    found: Found,
    planned: dict[float, tuple[pl.DataFrame, pl.DataFrame, list[Config]]],
    varies: Sequence[Vary],
    seeds: int,
) -> None:
    order = sorted(planned)
    whatif = pl.concat([planned[x][0] for x in order], how="diagonal_relaxed")
    turns = pl.concat([planned[x][1] for x in order], how="diagonal_relaxed")
    grid = [c for x in order for c in planned[x][2]]
    brackets = brackets_frame(found)
    io.atomic_write_parquet(found.out / "whatif.parquet", whatif)
    io.atomic_write_parquet(found.out / "turns.parquet", turns)
    io.atomic_write_parquet(found.out / "brackets.parquet", brackets)
    key_vary = Vary(found.key, tuple(dict.fromkeys(whatif[found.key].to_list())))
    what = "each arm's objective verdict" if found.by == "objective" else "the verdict"
    extra: list[Element] = [
        Heading(f"Where {what} flips along {found.key}"),
        Paragraph(
            f"Bisection per cell{' and cache arm' if found.by == 'objective' else ''}: the "
            "range's ends and three values between them planned, then every pair of "
            "neighbouring values with different verdicts halved; regions lists every run "
            "of one verdict over the planned values, in order (monotone false: a verdict "
            "comes back or steps back, so a region may lie between planned values; "
            "interior_checked false: --find-steps left no room for the interior values). "
            "The verdicts read the 95% interval, so their edges (below, above) move with "
            "--seeds; point_crossing is where the point estimate "
            f"({'goodput' if found.by == 'objective' else 'session gain'}) itself crosses "
            "the threshold, interpolated between planned values. Every value planned is "
            "a row of the decision table above."
        ),
        Table(whole_levels(_whole_values(brackets, found.integer).drop("flips")), max_rows=200),
    ]
    write_whatif_report(
        found.out, whatif.drop("find_value"), turns, grid, [key_vary, *varies], seeds=seeds,
        extra=extra,
    )  # fmt: skip
