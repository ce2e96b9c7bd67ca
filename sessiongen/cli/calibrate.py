"""``sessiongen calibrate``: the client's own overhead."""

from __future__ import annotations

import click

from sessiongen.cli.common import (
    load_scenario,
    set_option,
)


@click.command("calibrate")
@click.argument("scenario_file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--concurrency", type=click.IntRange(1), help="Streams at once (default: the scenario's)."
)
@click.option(
    "--body-kb",
    type=click.FloatRange(min=0, min_open=True),
    help="Request body size, KiB (default: the scenario's).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds of steady state (a p99 needs 662 requests).",
)
@set_option
def calibrate_cmd(
    scenario_file: str | None,
    concurrency: int | None,
    body_kb: float | None,
    duration: float,
    overrides: tuple[str, ...],
) -> None:
    """Measure the client's own added TTFT against a reference server.

    The reference server (its own process) answers after a known delay and stamps its
    own receive and send times, so added TTFT = client TTFT - server time: what the
    driver, the loopback and parsing add. Load defaults to SCENARIO_FILE's concurrency
    and turn-1 body size (64 streams of 0.5 MiB without a scenario). Prints the verdict
    (what the client adds at p50 and at its highest honest tail, and above which TTFT
    that is under 1% and 2%), then the figures, every tail with its sample count.
    """
    from sessiongen.calibrate.measure import calibrate, scenario_load
    from sessiongen.calibrate.verdict import DEFINITION, figure_lines

    conc, body = 64, 512 * 1024
    if scenario_file:
        conc, body = scenario_load(load_scenario(scenario_file, overrides))
    conc = concurrency or conc
    body = int(body_kb * 1024) if body_kb else body
    click.echo(
        f"calibrating at {conc} concurrent streams, {body / 1024:.0f} KiB bodies, "
        f"{duration:g} s of steady state ...",
        err=True,
    )
    figures = calibrate(conc, body, duration_s=duration)
    click.echo(f"verdict: {figures['verdict']}")
    click.echo(f"({DEFINITION})")
    for line in figure_lines(figures):
        click.echo(line)
