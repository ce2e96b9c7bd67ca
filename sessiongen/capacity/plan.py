"""What-if questions in virtual time: ``sessiongen plan SCENARIO --vary KEY=V1,V2 ...``.

Each configuration is the scenario with one value of every varied key (the Cartesian
product of the ``--vary`` options), replayed on the virtual clock
(:func:`~sessiongen.capacity.virtual.virtual_replay`) into a run folder of its own, so
every per-run tool (``sessiongen report``, the notebook, ``compare``) reads it. Any
scenario or profile key can vary: ``target.sim.pool_capacity_tokens``,
``target.sim.replicas``, ``target.sim.max_num_batched_tokens``, ``placement.policies``
(client placements and ``router:POLICY``), ``load.levels``,
``sessions.initial_context_tokens``, ...

The plan folder ``runs/plan-<scenario>-<time>/`` holds ``configs/NN-<label>/`` (the
runs), ``turns.parquet`` (per configuration, arm and turn: TTFT and the pool's gain)
and ``whatif.parquet`` (per configuration and placement: the headline figures, defined
in :data:`~sessiongen.analysis.whatif.WHATIF_COLUMNS`), and ``report/`` (the what-if
table and plots).
The session gain is replay's, computed by the same function
(:func:`sessiongen.analysis.latency.session_speedup` on the modeled end-to-end times),
so a plan and a replay of one scenario name and mean the same figure.

Each configuration runs ``seeds`` times (replicate ``k``: the scenario's seed plus
``k``, and a bootstrap draw of the profile's parameters when its file carries them; its
run folder ``configs/NN-<label>.rK``), and its what-if row pools the replicates'
sessions (:mod:`.decision`): the gains come with 95% intervals whose unit is a session,
and a verdict against ``pays_at`` (pays / does not pay / undecided, or unstable where
either cache arm's queue grows with the run at the cell's load level).

The (configuration, replicate) tasks run in parallel (:mod:`.sweep`: this machine's
cores by default, or a Ray cluster), each seeded by its own scenario, so the tables are
the same whatever the executor and the number of jobs.

Every figure is the model's: nothing here is measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import polars as pl

from sessiongen.analysis.load import in_flight_table
from sessiongen.analysis.payoff import (
    ARM,
    DEFAULT_PAYS_AT,
    arm_stability,
    pooled,
    turn_table,
    whatif_rows,
    with_verdicts,
)
from sessiongen.analysis.whatif import Config, Vary
from sessiongen.capacity.decision import DEFAULT_SEEDS, profile_draws, replicate_sets
from sessiongen.capacity.evidence import Evidence, evidence
from sessiongen.capacity.grid import configs
from sessiongen.capacity.sensitivity import console_lines
from sessiongen.capacity.sensitivity import sensitivity as sensitivity_of
from sessiongen.capacity.sweep import SweepOptions, run_all
from sessiongen.capacity.uncertainty import distinct, with_uncertainty
from sessiongen.capacity.virtual import (
    ConfigTask,
    PlannedRun,
    Tokens,
    check_plannable,
    plan_config,
    write_run,
)
from sessiongen.errors import UserError
from sessiongen.infra.collector import frozen_heap
from sessiongen.infra.files import ensure_dir, output_error
from sessiongen.infra.stages import stage
from sessiongen.records import io
from sessiongen.records.run import Run, load_run
from sessiongen.report.whatif import (
    decision_table,
    evidence_lines,
    whole_levels,
    write_whatif_report,
)


def plan(
    path: str | Path,
    *,
    overrides: Sequence[str] = (),
    varies: Sequence[Vary] = (),
    runs_dir: Path = Path("runs"),
    tokens: Tokens = "auto",
    progress: bool = False,
    sweep: SweepOptions | None = None,
    on_config: Callable[[Config, Path], None] | None = None,
    seeds: int = DEFAULT_SEEDS,
    pays_at: float = DEFAULT_PAYS_AT,
    sensitivity: bool = True,
) -> Path:
    """Run the grid, ``seeds`` replicates of each configuration (:mod:`.decision`), spread
    out as ``sweep`` says (:mod:`.sweep`; default: over this machine's cores); write the
    plan folder (module doc) with each row's verdict against ``pays_at``; return its path.
    With ``sensitivity``, each row's verdict is also read at both ends of every profile
    parameter's box (:mod:`.sensitivity`: ``sensitivity.parquet``, ``robustness`` and
    ``sensitive_to``; one more run per configuration and end).

    Block progress bars show only when the tasks run one after another in this
    process; otherwise ``on_config`` (called as each configuration's replicate
    finishes, in whatever order, then as each sensitivity end does) is the progress.
    Each run folder is written here, whichever process or node planned it.
    """
    sweep = sweep or SweepOptions()
    sweep.check()
    check_decision(seeds, pays_at)
    with frozen_heap():  # the imports' objects left out of the collector's passes
        return _plan(
            path, overrides, varies, runs_dir=runs_dir, tokens=tokens, progress=progress,
            sweep=sweep, on_config=on_config, seeds=seeds, pays_at=pays_at,
            sensitivity=sensitivity,
        )  # fmt: skip


def _plan(
    path: str | Path,
    overrides: Sequence[str],
    varies: Sequence[Vary],
    *,
    runs_dir: Path,
    tokens: Tokens,
    progress: bool,
    sweep: SweepOptions,
    on_config: Callable[[Config, Path], None] | None,
    seeds: int,
    pays_at: float,
    sensitivity: bool,
) -> Path:
    with stage("scenario and grid"):
        grid = configs(path, overrides, varies)
    out = new_plan_folder(runs_dir, "plan", grid[0].scenario.name)
    whatif, turn_frame = run_grid(
        path, overrides, varies, out, tokens=tokens, progress=progress, sweep=sweep,
        on_config=on_config, seeds=seeds,
    )  # fmt: skip
    whatif = with_verdicts(whatif, pays_at)
    if sensitivity:
        with stage("sensitivity (its runs and rows)"):
            whatif = sensitivity_of(
                path, overrides, varies, grid, out, whatif, rows=whatif_rows, tokens=tokens,
                sweep=sweep, on_done=on_config,
            )  # fmt: skip
    with stage("plan tables written"):
        io.atomic_write_parquet(out / "turns.parquet", turn_frame)
        io.atomic_write_parquet(out / "whatif.parquet", whatif)
    with stage("report and figures"):
        write_whatif_report(out, whatif, turn_frame, grid, list(varies), seeds=seeds)
    return out


def check_decision(seeds: int, pays_at: float) -> None:
    if seeds < 1:
        raise UserError(f"--seeds: expected an integer >= 1, got {seeds}")
    if not (math.isfinite(pays_at) and pays_at > 0):
        raise UserError(f"--pays-at: expected a gain > 0 (e.g. 1.1), got {pays_at}")


def new_plan_folder(runs_dir: Path, kind: str, name: str) -> Path:
    out = ensure_dir(runs_dir) / f"{kind}-{io.new_run_id(name)}"
    try:
        out.mkdir()
    except OSError as exc:
        raise output_error(out, exc) from None
    ensure_dir(out / "configs")
    return out


def replicate_folder(config: Config, k: int) -> str:
    """Replicate ``k``'s run folder under ``configs/``: the configuration's for the
    first, ``NN-label.rK`` for the others."""
    return config.folder if k == 0 else f"{config.folder}.r{k}"


def run_grid(
    path: str | Path,
    overrides: Sequence[str],
    varies: Sequence[Vary],
    out: Path,
    *,
    tokens: Tokens,
    progress: bool,
    sweep: SweepOptions,
    on_config: Callable[[Config, Path], None] | None,
    seeds: int,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every (configuration, replicate) as one sweep task, each run folder written under
    ``out/configs``; the what-if rows (replicates pooled) and per-turn rows in grid order."""
    with stage("scenario and grid"):
        grid = configs(path, overrides, varies)
        draws = profile_draws(grid[0].scenario)
        profile = grid[0].scenario.target.sim.profile
        base = grid[0].scenario.seed
        grids = [grid] + [
            configs(path, [*overrides, *replicate_sets(k, base, draws, profile=profile)], varies)
            for k in range(1, seeds)
        ]
        for g in grids:  # before anything runs, and here rather than in a worker
            for config in g:
                check_plannable(config.scenario)
    pairs = [(c, k) for c in grid for k in range(seeds)]
    alone = sweep.executor == "local" and sweep.workers(len(pairs)) == 1
    tasks = [
        ConfigTask(grids[k][c.index].scenario, replicate_folder(c, k), tokens, progress and alone)
        for c, k in pairs
    ]
    run_dirs: dict[tuple[int, int], Path] = {}

    def finished(i: int, planned: PlannedRun) -> None:
        config, k = pairs[i]
        with stage("run folders written"):
            run_dirs[config.index, k] = write_run(
                out / "configs" / replicate_folder(config, k), planned
            )
        if on_config is not None:
            on_config(config, run_dirs[config.index, k])

    # every block's engine, its trace read, prompts and records (in this process, each
    # block is also its own stage: infra.progress times it)
    with stage("configurations planned (blocks, trace read, prompts, records)"):
        run_all(plan_config, tasks, sweep, finished)
    proof = evidence(grid[0].scenario)
    turns, rows = [], []
    for config in grid:  # in grid order, whatever order they finished in
        with stage("run folders read and pooled"):
            runs = [load_run(run_dirs[config.index, k]) for k in range(seeds)]
            kept = [runs[i] for i in distinct(runs)]  # a repeated replicate learned nothing
            run = pooled(kept)
        tag = {"config": config.index, "label": config.label, **config.values}
        with stage("turn table"):
            turns.append(turn_table(run).with_columns(*_lits(tag)))
        with stage("decision (what-if rows and their bootstrap)"):
            row = whatif_rows(run)
        with stage("replicate spread, stability, in flight"):
            spread = replicate_spread(kept, pooled_rows=row)
            row = row.join(spread, on=ARM, how="left", nulls_equal=True)
            row = row.join(arm_stability(kept), on=ARM, how="left", nulls_equal=True)
            busy = in_flight_table(pooled(kept, blocks_apart=True), wide=True)
            row = row.join(busy, on=ARM, how="left", nulls_equal=True)
        drawn = seeds - 1 if draws else 0
        closed = config.scenario.load.arrival == "closed" and not run.trace
        with stage("model error"):
            row = with_uncertainty(row, proof.model_error, drawn=drawn > 0, closed=closed)
        rows.append(
            row.with_columns(
                pl.lit(seeds).alias("replicates"),
                pl.lit(len(kept)).alias("distinct_replicates"),
                pl.lit(drawn).alias("parameter_draws"),
                *_lits(evidence_columns(proof)),
                *_lits(tag),
            )
        )
    front = ["config", "label", *(v.key for v in varies)]
    turn_frame = _front(pl.concat(turns, how="diagonal_relaxed"), front)
    whatif = _front(pl.concat(rows, how="diagonal_relaxed"), front)
    return whatif, turn_frame


def replicate_spread(
    runs: Sequence[Run], *, pooled_rows: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Per arm: each replicate's own session and later-turn gains (lists, for
    :func:`~sessiongen.capacity.uncertainty.with_uncertainty`) and their extremes.
    ``pooled_rows``: the replicates' pooled what-if rows, which for one replicate are
    its own (the same gains: pooling one run only renames its sessions)."""
    if pooled_rows is not None and len(runs) == 1:
        per = pooled_rows
    else:
        per = pl.concat([whatif_rows(r) for r in runs], how="diagonal_relaxed")
    return per.group_by(ARM).agg(
        pl.col("session_gain").min().alias("session_gain_seed_min"),
        pl.col("session_gain").max().alias("session_gain_seed_max"),
        pl.col("session_gain").alias("session_gain_replicates"),
        pl.col("later_gain").alias("later_gain_replicates"),
    )


def evidence_columns(proof: Evidence) -> dict[str, str | bool | int | None]:
    """What a verdict rests on, as what-if columns (:mod:`.evidence`)."""
    return {
        "profile": proof.profile,
        "profile_fitted": proof.fitted,
        "profile_date": proof.date,
        "profile_runs": len(proof.runs),
        "profile_hardware": proof.hardware,
        "evidence": proof.line(),
        "model_error_source": proof.model_error_source,
    }


def _lits(tag: Mapping[str, object]) -> list[pl.Expr]:
    return [pl.lit(v).alias(k) for k, v in tag.items()]


def _front(frame: pl.DataFrame, first: list[str]) -> pl.DataFrame:
    return frame.select(*first, *(c for c in frame.columns if c not in first))


def console_table(out: Path, varies: Sequence[Vary], *, decision_only: bool = False) -> str:
    """The decision table as text: per configuration and arm, the gains and goodput with
    their intervals and the verdict, then the what-if figures."""
    whatif = pl.read_parquet(out / "whatif.parquet")
    decision = decision_table(whatif, varies).rename({k: k.rsplit(".", 1)[-1] for k in
                                                      (v.key for v in varies)})  # fmt: skip
    whatif = whole_levels(whatif)
    keys = [v.key for v in varies]
    shown = whatif.select(
        *keys,
        "placement",
        "context_tokens",
        "load_level",
        pl.col("session_gain").round(2),
        pl.col("later_turn_gain").round(2),
        pl.col("ttft_p50_off_s").round(3),
        pl.col("ttft_p50_on_s").round(3),
        pl.col("pool_hit_rate_on").round(3),
        pl.col("queue_p90_on_s").round(3),
    ).rename({k: k.rsplit(".", 1)[-1] for k in keys})
    pays_at = float(whatif["pays_at"][0])
    replicates = int(whatif["replicates"][0])
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True, tbl_width_chars=260,
                   fmt_str_lengths=60):  # fmt: skip
        text = (
            f"Decision (PLANNED): does the pool pay, session gain >= {pays_at:g}? "
            f"{replicates} replicate{'s' if replicates > 1 else ''} per configuration\n"
            + "".join(f"{line}\n" for line in evidence_lines(whatif))
            + f"{decision}"
        )
        text += "".join(f"\n{line}" for line in console_lines(whatif))
        if decision_only:
            return text
        return text + "\nWhat if (PLANNED, modeled seconds; not measured)\n" + str(shown)
