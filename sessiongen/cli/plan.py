"""``sessiongen plan``: what-if questions on the virtual clock."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import click

from sessiongen.cli.common import (
    pays_at_option,
    set_option,
)
from sessiongen.infra.collector import no_collections
from sessiongen.infra.stages import TIMER, stage


@click.command("plan")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "--vary",
    "varies",
    multiple=True,
    metavar="KEY=V1,V2",
    help="A scenario or profile key and its values, e.g. --vary target.sim.replicas=2,4 "
    "(repeatable: every combination runs).",
)
@click.option(
    "--profile",
    type=click.Path(dir_okay=False),
    help="A profile file (sessiongen fit writes one): --set target.sim.profile=PROFILE.",
)
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--tokens",
    type=click.Choice(["auto", "exact", "shape"]),
    default="auto",
    show_default=True,
    help="Prompts tokenized exactly, or synthetic keys of the same shape (large runs).",
)
@click.option(
    "--jobs",
    type=click.IntRange(1),
    help="Configurations planned at once, each in its own process (default: this "
    "machine's cores; each holds one configuration's records in memory; with "
    "--executor ray, Ray's CPUs decide instead).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where configurations run: processes here, or Ray tasks (pip install "
    "'sessiongen[ray]'; sessiongen installed on every node).",
)
@click.option(
    "--address",
    metavar="ADDR",
    help="The Ray cluster to use (ray.init's address: auto, ray://HOST:10001); default: "
    "RAY_ADDRESS, else a local Ray instance.",
)
@click.option(
    "--seeds",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Replicates per configuration: the scenario's seed, then seed+1, ... (arrivals, "
    "pauses, lengths; and the fit's parameter draws when the profile carries them), "
    "their sessions pooled for the intervals.",
)
@pays_at_option(
    "The session gain (OFF / ON) the pool must reach: its 95% interval wholly at or "
    "above it pays, wholly below does not pay, straddling it is undecided."
)
@click.option(
    "--find",
    "find_spec",
    metavar="KEY=LOW:HIGH",
    help="Bisect one numeric key for where each cell's verdict changes, e.g. --find "
    "target.sim.pool_capacity_gib=1:256 (integers when both ends are).",
)
@click.option(
    "--find-by",
    type=click.Choice(["verdict", "objective"]),
    default="verdict",
    show_default=True,
    help="What --find brackets: the pool's verdict, or where each cache arm stops meeting "
    "the scenario's [objective] (goodput's interval against its attainment).",
)
@click.option(
    "--find-steps",
    type=click.IntRange(1),
    default=6,
    show_default=True,
    help="Halvings per boundary of --find (each plans every configuration and seed).",
)
@click.option(
    "--sensitivity/--no-sensitivity",
    default=True,
    show_default=True,
    help="Read each verdict again at both ends of every profile parameter's box (its "
    "fitted interval, else +-10%): one more run per configuration, parameter and end; "
    "the table says which parameter flips a verdict.",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option(
    "--verbose",
    is_flag=True,
    help="Print each stage's wall and CPU seconds at the end (start-up, the configurations' "
    "blocks, the decision, the report, ...; stages in worker processes are not split).",
)
@set_option
def plan_cmd(
    scenario_file: str,
    varies: tuple[str, ...],
    profile: str | None,
    runs_dir: str,
    tokens: str,
    jobs: int | None,
    executor: str,
    address: str | None,
    seeds: int,
    pays_at: float,
    find_spec: str | None,
    find_by: str,
    find_steps: int,
    sensitivity: bool,
    progress: bool,
    verbose: bool,
    overrides: tuple[str, ...],
) -> None:
    """Answer what-if questions on the simulator's virtual clock (no server, no waiting).

    Replays SCENARIO_FILE once per combination of the --vary values, on the same engine
    as the simulated pair, and writes runs/plan-.../ with one run folder per
    configuration, whatif.parquet, turns.parquet and a report. Configurations run in
    parallel, over this machine's cores (--jobs) or as Ray tasks (--executor ray); the
    tables are the same either way. Every figure is the simulator's (fit it to your
    hardware with sessiongen fit), never a measurement.

    Each configuration runs --seeds times; the decision table gives the pool's gain
    (whole session, later turns) and goodput with 95% intervals and a verdict against
    --pays-at. --find KEY=LOW:HIGH bisects one key for where the verdict changes
    (--find-by objective: where each arm stops meeting the objective).
    """
    if verbose:
        TIMER.start(since_process_start="start-up (interpreter, imports, options)")
    # importing makes a few hundred thousand objects and no garbage: no passes over them
    with stage("planner imported"), no_collections():
        from sessiongen.analysis.whatif import Config, Vary
        from sessiongen.capacity import plan as plan_mod
        from sessiongen.capacity.sweep import Executor, SweepOptions
        from sessiongen.capacity.virtual import Tokens

    parsed = [Vary.parse(v) for v in varies]
    sets = (*((f"target.sim.profile={profile}",) if profile else ()), *overrides)
    sweep = SweepOptions(jobs, cast(Executor, executor), address)
    if find_spec is not None:
        from sessiongen.capacity.find import FindBy, find

        def point(value: float, rows: object) -> None:
            click.echo(f"planned {find_spec.partition('=')[0]}={value:g}")

        found = find(
            scenario_file, find_spec, overrides=sets, varies=parsed, runs_dir=Path(runs_dir),
            tokens=cast(Tokens, tokens), sweep=sweep, seeds=seeds, pays_at=pays_at,
            steps=find_steps, on_point=point, by=cast(FindBy, find_by),
        )  # fmt: skip
        click.echo(
            plan_mod.console_table(found.out, [Vary(found.key, ()), *parsed], decision_only=True)
        )
        if found.by == "objective":
            click.echo(f"Where each arm stops meeting the objective ({seeds} seeds):")
        else:
            click.echo(f"Where the verdict flips (pays at {pays_at:g}, {seeds} seeds):")
        for line in found.lines():
            click.echo(f"  {line}")
        click.echo(f"find: {found.out}")
        click.echo(f"report: {found.out / 'report' / 'report.md'}")
        _print_stages(verbose=verbose)
        return
    total = seeds
    for v in parsed:
        total *= len(v.values)
    finished: list[int] = []

    def done(config: Config, run_dir: Path) -> None:
        finished.append(config.index)
        if len(finished) <= total:
            click.echo(f"[{len(finished)}/{total}] {config.label}: {run_dir}")
        else:  # the ends of the sensitivity box, after the grid
            click.echo(f"[sensitivity {len(finished) - total}] {config.label}: {run_dir}")

    out = plan_mod.plan(
        scenario_file,
        overrides=sets,
        varies=parsed,
        runs_dir=Path(runs_dir),
        tokens=cast(Tokens, tokens),
        progress=progress,
        sweep=sweep,
        on_config=done,
        seeds=seeds,
        pays_at=pays_at,
        sensitivity=sensitivity,
    )
    with stage("console table"):
        click.echo(plan_mod.console_table(out, parsed))
    click.echo(f"plan: {out}")
    click.echo(f"report: {out / 'report' / 'report.md'}")
    _print_stages(verbose=verbose)


def _print_stages(*, verbose: bool) -> None:
    """``--verbose``: each stage's time, on stderr (the tables stay alone on stdout)."""
    for line in TIMER.lines() if verbose else ():
        click.echo(line, err=True)
