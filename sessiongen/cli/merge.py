"""``sessiongen merge``: runs of one design's arms as one run folder."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("merge")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False),
    help="The new run folder [default: a new run id beside the first run].",
)
def merge(run_dirs: tuple[str, ...], output: str | None) -> None:
    """Combine runs of one design's different arms (RUN_OFF RUN_ON) into one run folder.

    The runs must share scenario, seed and target (a single-arm run per arm, e.g.
    replay --endpoints A,B --cache off, then --cache on); each run's blocks take their
    places in the design, so the merged run reads as one run of both arms.
    """
    from sessiongen.records.merge import merge_runs

    click.echo(f"merged: {merge_runs([Path(d) for d in run_dirs], output)}")
