"""``sessiongen report``: a run folder's report (several runs merged first)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
def report(run_dirs: tuple[str, ...]) -> None:
    """Write RUN_DIR/report/: report.md, report.html, summary.csv and plots (PNG, SVG).

    Several run folders (RUN_OFF RUN_ON: runs of one scenario, seed and target, each of
    its own arms) are merged first into a new run folder beside the first (see merge),
    and the report is that run's.
    """
    from sessiongen import report as report_mod

    run_dir = Path(run_dirs[0])
    if len(run_dirs) > 1:
        from sessiongen.records.merge import merge_runs

        run_dir = merge_runs([Path(d) for d in run_dirs])
        click.echo(f"merged: {run_dir}")
    click.echo(f"report: {report_mod.write_report(run_dir)}")
