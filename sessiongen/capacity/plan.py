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
in :data:`~sessiongen.capacity.grid.WHATIF_COLUMNS`), and ``report/`` (the what-if table and plots).
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
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen.analysis.latency import session_speedup, speedup_table
from sessiongen.analysis.load import in_flight_table
from sessiongen.analysis.stats import clustered_share
from sessiongen.capacity.decision import (
    DEFAULT_PAYS_AT,
    DEFAULT_SEEDS,
    arm_stability,
    pooled,
    profile_draws,
    replicate_sets,
    with_verdicts,
)
from sessiongen.capacity.evidence import Evidence, evidence
from sessiongen.capacity.grid import Config, Vary, configs
from sessiongen.capacity.sensitivity import console_lines
from sessiongen.capacity.sensitivity import sensitivity as sensitivity_of
from sessiongen.capacity.sweep import SweepOptions, run_all
from sessiongen.capacity.uncertainty import distinct, evidence_lines, with_uncertainty
from sessiongen.capacity.virtual import (
    ConfigTask,
    PlannedRun,
    Tokens,
    check_plannable,
    plan_config,
    write_run,
)
from sessiongen.errors import UserError
from sessiongen.infra.files import ensure_dir, output_error
from sessiongen.records import io
from sessiongen.records.run import Run, load_run
from sessiongen.report.whatif import decision_table, whole_levels, write_whatif_report


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
    grid = configs(path, overrides, varies)
    out = new_plan_folder(runs_dir, "plan", grid[0].scenario.name)
    whatif, turn_frame = run_grid(
        path, overrides, varies, out, tokens=tokens, progress=progress, sweep=sweep,
        on_config=on_config, seeds=seeds,
    )  # fmt: skip
    whatif = with_verdicts(whatif, pays_at)
    if sensitivity:
        whatif = sensitivity_of(
            path, overrides, varies, grid, out, whatif, rows=whatif_rows, tokens=tokens,
            sweep=sweep, on_done=on_config,
        )  # fmt: skip
    io.atomic_write_parquet(out / "turns.parquet", turn_frame)
    io.atomic_write_parquet(out / "whatif.parquet", whatif)
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
        run_dirs[config.index, k] = write_run(
            out / "configs" / replicate_folder(config, k), planned
        )
        if on_config is not None:
            on_config(config, run_dirs[config.index, k])

    run_all(plan_config, tasks, sweep, finished)
    proof = evidence(grid[0].scenario)
    turns, rows = [], []
    for config in grid:  # in grid order, whatever order they finished in
        runs = [load_run(run_dirs[config.index, k]) for k in range(seeds)]
        kept = [runs[i] for i in distinct(runs)]  # a repeated replicate learned nothing
        run = pooled(kept)
        tag = {"config": config.index, "label": config.label, **config.values}
        turns.append(turn_table(run).with_columns(*_lits(tag)))
        row = whatif_rows(run).join(replicate_spread(kept), on=ARM, how="left", nulls_equal=True)
        row = row.join(arm_stability(kept), on=ARM, how="left", nulls_equal=True)
        busy = in_flight_table(pooled(kept, blocks_apart=True), wide=True)
        row = row.join(busy, on=ARM, how="left", nulls_equal=True)
        drawn = seeds - 1 if draws else 0
        closed = config.scenario.load.arrival == "closed" and not run.trace
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


def replicate_spread(runs: Sequence[Run]) -> pl.DataFrame:
    """Per arm: each replicate's own session and later-turn gains (lists, for
    :func:`~sessiongen.capacity.uncertainty.with_uncertainty`) and their extremes."""
    per = pl.concat([whatif_rows(r) for r in runs], how="diagonal_relaxed")
    return per.group_by(ARM).agg(
        pl.col("session_gain").min().alias("session_gain_seed_min"),
        pl.col("session_gain").max().alias("session_gain_seed_max"),
        pl.col("session_gain").alias("session_gain_replicates"),
        pl.col("later_gain").alias("later_gain_replicates"),
    )


def evidence_columns(proof: Evidence) -> dict[str, Any]:
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


def _lits(tag: dict[str, Any]) -> list[pl.Expr]:
    return [pl.lit(v).alias(k) for k, v in tag.items()]


def _front(frame: pl.DataFrame, first: list[str]) -> pl.DataFrame:
    return frame.select(*first, *(c for c in frame.columns if c not in first))


#: The keys of an arm in a plan's tables.
ARM = ["placement", "context_tokens", "load_level"]


def _measured(run: Run) -> pl.DataFrame:
    return run.ok.with_columns(pl.col("load_level").fill_null(1.0))


def turn_table(run: Run) -> pl.DataFrame:
    """Per arm and turn: median and p90 TTFT per cache arm and the pool's gain."""
    ok = _measured(run)
    per = ok.group_by([*ARM, "cache", "turn"]).agg(
        pl.col("ttft_s").median().alias("ttft_p50_s"),
        pl.col("ttft_s").quantile(0.9, "nearest").alias("ttft_p90_s"),
        pl.len().alias("n"),
    )
    wide = per.pivot(on="cache", index=[*ARM, "turn"], values=["ttft_p50_s", "ttft_p90_s", "n"])
    for col in ("ttft_p50_s_off", "ttft_p50_s_on"):
        if col not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    # the pivot's columns follow the order the groups came in, which varies run to run
    arms = [f"{v}_{c}" for v in ("ttft_p50_s", "ttft_p90_s", "n") for c in ("off", "on")]
    return wide.select(
        *ARM,
        "turn",
        *(c for c in arms if c in wide.columns),
        (pl.col("ttft_p50_s_off") / pl.col("ttft_p50_s_on")).alias("pool_gain"),
    ).sort([*ARM, "turn"])


def _session_gain(run: Run, column: str, name: str) -> pl.DataFrame:
    """Per arm: the replay's session gain (or its TTFT-sum twin), the same function."""
    gains = session_speedup(run, extra_keys=("load_level",), column=column)
    return gains.select(
        "placement",
        "context_tokens",
        pl.col("load_level").fill_null(1.0),
        pl.col("speedup").alias(name),
        pl.col("speedup_ci_low").alias(f"{name}_low"),
        pl.col("speedup_ci_high").alias(f"{name}_high"),
        pl.col("n_units").alias(f"{name}_units"),
        pl.col("unit").alias(f"{name}_unit"),
    )


def _later_gain(run: Run) -> pl.DataFrame:
    """Per arm: median TTFT over turns 2.. OFF / ON, sessions the units (the same paired
    bootstrap as the per-turn speedup, every later turn of a session one unit's values)."""
    later = run.filter(pl.col("turn") >= 2)
    later = replace(
        later,
        requests=later.requests.with_columns(
            pl.lit(2).alias("turn"), pl.col("load_level").fill_null(1.0)
        ),
    )
    gains = speedup_table(later, extra_keys=("load_level",))
    return gains.select(
        *ARM,
        pl.col("speedup").alias("later_gain"),
        pl.col("speedup_ci_low").alias("later_gain_low"),
        pl.col("speedup_ci_high").alias("later_gain_high"),
    )


def _goodput(ok: pl.DataFrame, target: float) -> pl.DataFrame:
    """Per arm and cache arm: the share of turns within the objective's 95% interval,
    sessions the clusters (:func:`~sessiongen.analysis.stats.clustered_share`), wide
    (``good_turns_off_low`` .. ``good_turns_on_high``)."""
    per = ok.group_by([*ARM, "cache", "session_index"]).agg(
        (pl.col("ttft_s") <= target).sum().alias("good"), pl.len().alias("turns")
    )
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, sub in per.group_by([*ARM, "cache"]):
        share = clustered_share(sub["good"].to_numpy(), sub["turns"].to_numpy())
        row = rows.setdefault(key[:-1], dict(zip(ARM, key[:-1], strict=True)))
        row[f"good_turns_{key[-1]}_low"], row[f"good_turns_{key[-1]}_high"] = share.low, share.high
    return pl.DataFrame(
        list(rows.values()),
        schema=per.select(ARM).schema | {c: pl.Float64 for c in GOODPUT_BOUNDS},
    )


#: The goodput interval's columns, per cache arm.
GOODPUT_BOUNDS = tuple(f"good_turns_{c}_{end}" for c in ("off", "on") for end in ("low", "high"))


def whatif_rows(run: Run) -> pl.DataFrame:
    """Per arm: the headline figures (:data:`~sessiongen.capacity.grid.WHATIF_COLUMNS`)."""
    ok = _measured(run)
    objective = run.meta.scenario.get("objective") or {}
    target = objective.get("ttft_s")
    good = (pl.col("ttft_s") <= target).mean() if target else pl.lit(None, dtype=pl.Float64)
    per_arm = ok.group_by([*ARM, "cache"]).agg(
        pl.col("ttft_s").median().alias("ttft_p50_s"),
        pl.col("ttft_s").quantile(0.9, "nearest").alias("ttft_p90_s"),
        good.alias("good_turns"),
        (pl.col("local_hit_tokens").sum() / pl.col("prompt_tokens").sum()).alias("local_hit"),
        (pl.col("external_hit_tokens").sum() / pl.col("prompt_tokens").sum()).alias("pool_hit"),
        pl.col("server_queue_s").quantile(0.9, "nearest").alias("queue_p90_s"),
        pl.len().alias("requests"),
    )
    sessions = _session_gain(run, "total_e2e_s", "session_gain").join(
        _session_gain(run, "total_ttft_s", "ttft_sum_gain").select(*ARM, "ttft_sum_gain"),
        on=ARM,
        how="full",
        coalesce=True,
    )
    turns = turn_table(run)
    later = (
        turns.filter(pl.col("turn") >= 2)
        .group_by(ARM)
        .agg(pl.col("pool_gain").median().alias("later_turn_gain"))
    )

    def side(cache: str) -> pl.DataFrame:
        return per_arm.filter(pl.col("cache") == cache).drop("cache")

    wide = side("off").join(side("on"), on=ARM, how="full", coalesce=True, suffix="_on")
    wide = wide.join(sessions, on=ARM, how="left").join(later, on=ARM, how="left")
    wide = wide.join(_later_gain(run), on=ARM, how="left")
    if target:
        wide = wide.join(_goodput(ok, target), on=ARM, how="left")
    else:
        wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(c) for c in GOODPUT_BOUNDS)
    return wide.select(
        *ARM,
        "session_gain",
        "session_gain_low",
        "session_gain_high",
        pl.col("session_gain_units").alias("sessions"),
        pl.col("session_gain_unit").alias("unit"),
        "later_gain",
        "later_gain_low",
        "later_gain_high",
        "ttft_sum_gain",
        "later_turn_gain",
        pl.col("ttft_p50_s").alias("ttft_p50_off_s"),
        pl.col("ttft_p50_s_on").alias("ttft_p50_on_s"),
        pl.col("ttft_p90_s_on").alias("ttft_p90_on_s"),
        pl.col("good_turns").alias("good_turns_off"),
        "good_turns_off_low",
        "good_turns_off_high",
        pl.col("good_turns_on"),
        "good_turns_on_low",
        "good_turns_on_high",
        pl.lit(objective.get("attainment") if target else None, dtype=pl.Float64).alias(
            "attainment"
        ),
        pl.col("local_hit_on").alias("local_hit_rate_on"),
        pl.col("pool_hit_on").alias("pool_hit_rate_on"),
        pl.col("queue_p90_s_on").alias("queue_p90_on_s"),
        (pl.col("requests").fill_null(0) + pl.col("requests_on").fill_null(0)).alias("requests"),
    ).sort(ARM)


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
