"""``sessiongen notebook``: the analysis notebook executed on a run folder."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("notebook")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="The executed notebook: OUT.html (one page) or OUT.ipynb "
    "[default: RUN_DIR/report/analysis.html].",
)
def notebook(run_dir: str, output: str | None) -> None:
    """Execute the analysis notebook on RUN_DIR and write the executed copy.

    Runs notebooks/analysis.ipynb top to bottom in a fresh kernel on RUN_DIR (the
    repository's copy is never written): the report's Problems and Limits first, the
    headline speedups, the details, and a cell to slice your own way. Exit status 1
    when a cell fails (the output is written, the error in it).
    """
    from sessiongen.report.notebook import run_notebook

    click.echo(f"notebook: {run_notebook(Path(run_dir), output)}")
