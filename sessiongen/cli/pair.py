"""``sessiongen pair``: real replicas that outlive the command."""

from __future__ import annotations

from pathlib import Path

import click

from sessiongen.cli.common import (
    load_scenario,
    set_option,
)


@click.group("pair")
def pair() -> None:
    """Real replicas (vLLM + one LMCache server) that outlive the command.

    Needs the real stack: scripts/install-real-stack.sh installs the CPU build.
    """


STATE_DIR_OPTION = click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    default="runs/pair",
    show_default=True,
    help="Where the pair's state file and logs live.",
)


@pair.command("up")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--cache", type=click.Choice(["on", "off"]), default="on", show_default=True)
@STATE_DIR_OPTION
@set_option
def pair_up(scenario_file: str, cache: str, state_dir: str, overrides: tuple[str, ...]) -> None:
    """Start the managed pair of SCENARIO_FILE ([target.managed]) and leave it running."""
    from sessiongen.launch.state import pair_up as up
    from sessiongen.launch.state import records

    sc = load_scenario(scenario_file, overrides)
    state = up(sc, Path(state_dir), cache_on=cache == "on")
    for rec in records(state):
        click.echo(f"{rec.name}: pid {rec.pid} {rec.url}".rstrip())
    click.echo(f"state: {Path(state_dir) / 'pair.json'}  (stop with: sessiongen pair down)")


@pair.command("down")
@STATE_DIR_OPTION
def pair_down(state_dir: str) -> None:
    """Stop the pair recorded in --state-dir (every process group, no orphans)."""
    from sessiongen.launch.state import pair_down as down

    lines = down(Path(state_dir))
    for line in lines or ["no pair recorded"]:
        click.echo(line)


@pair.command("status")
@STATE_DIR_OPTION
def pair_status(state_dir: str) -> None:
    """Show each recorded process: alive, healthy, port, log."""
    from sessiongen.launch.state import pair_status as status

    rows = status(Path(state_dir))
    if not rows:
        click.echo("no pair recorded")
    for row in rows:
        health = "healthy" if row.get("healthy") else "not healthy"
        alive = "alive" if row.get("alive") else "gone"
        click.echo(
            f"{row.get('name')}: {alive}, {health}, {row.get('url') or ''} log {row.get('log')}"
        )
