"""``sessiongen nightly``: the nightly suite, stored, checked and plotted."""

from __future__ import annotations

from pathlib import Path

import click

from sessiongen.cli.common import (
    STORE_OPTION,
)
from sessiongen.infra import signals


@click.command("nightly")
@click.argument("config", type=click.Path(dir_okay=False))
@STORE_OPTION
@click.option(
    "--runs-dir", type=click.Path(file_okay=False), default="runs/nightly", show_default=True
)
@click.option(
    "--progress/--no-progress",
    default=False,
    show_default=True,
    help="Each block's progress line too (a line per scenario as it starts and ends is "
    "always printed, on stderr).",
)
def nightly(config: str, store: str, runs_dir: str, progress: bool) -> None:
    """Run the suite in CONFIG, report each run, add to the store, check and plot.

    Exit 1 on a regression or a failed run, 0 otherwise. See nightly/example.toml.
    """
    from sessiongen.trend.nightly import run_nightly

    def say(line: str) -> None:
        click.echo(line, err=True)

    result = run_nightly(Path(config), Path(store), Path(runs_dir), progress=progress, say=say)
    click.echo(f"summary: {result.summary}")
    if result.check is not None:
        click.echo(result.check.table())
    if result.exit_code:
        raise SystemExit(signals.exit_status() if result.interrupted else result.exit_code)
