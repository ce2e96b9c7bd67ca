"""``sessiongen fit``: the simulator's profile fitted to real runs."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("fit")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), required=True, help="Profile TOML to write."
)
@click.option(
    "--kv-bytes-per-token",
    type=click.IntRange(1),
    help="The model's KV bytes per token (default: from the runs, where they say it).",
)
@click.option(
    "--resamples",
    type=click.IntRange(1000),
    help="Bootstrap resamples behind each interval (at least 1000; default 2000).",
)
@click.option(
    "--heldout",
    "heldout",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A replay (both cache arms) not given to the fit, planned with the fitted profile "
    "to measure the model's own error per regime ([fit.model_error]); repeat for more.",
)
def fit_cmd(
    run_dirs: tuple[str, ...],
    output: str,
    kv_bytes_per_token: int | None,
    resamples: int | None,
    heldout: tuple[str, ...],
) -> None:
    """Fit the simulator's timing profile to real runs of RUN_DIRS.

    Uses the requests that ran alone (concurrency 1, exact hit counts): cold prefills
    at several sizes, local hits and cross-replica pool hits, as the probe scenario
    (scenarios/fitprobe.toml) makes them. Prints each parameter with a 95% bootstrap
    interval over sessions (and over runs, when several are given), or says that the
    runs do not identify it, then the design's rank, warnings and the residuals per
    cell; writes a profile that --set target.sim.profile=OUTPUT loads.

    Runs with sessions in flight together (scenarios/fitprobe-load.toml) give the loaded
    terms: decode batching and whether pool loads hold the engine step, chosen by
    planning those runs under each candidate; it says which the runs identify.

    With --heldout RUN (replays of both cache arms that the fit does not see), each is
    planned with the fitted profile and its planned session gains are compared with the
    measured ones: the model's own error per regime (one session in flight, loaded) is
    written into the profile for the planner's intervals.
    """
    from sessiongen.capacity import fit

    result = fit.fit_runs(
        [Path(d) for d in run_dirs],
        kv_bytes_per_token=kv_bytes_per_token,
        resamples=resamples or fit.RESAMPLES,
        progress=True,
        heldout=[Path(d) for d in heldout],
    )
    click.echo(fit.summary_text(result))
    click.echo(f"profile: {fit.write_profile(result, Path(output))}")
