"""``sessiongen compare``: one run (or side of runs) against another."""

from __future__ import annotations

from pathlib import Path

import click

from sessiongen.errors import RunDirError


@click.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=0.05,
    show_default=True,
    help="Margin of 'no change': ratios within 1 +- threshold are the same (0.05 = 5%).",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    help="Level of each test; the intervals are 1 - 2 alpha (90% by default, as in TOST).",
)
@click.option(
    "--failure-margin",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.02,
    show_default=True,
    help="Largest rise in the share of failed requests per cell that is still the same.",
)
@click.option(
    "--run-noise",
    type=click.FloatRange(min=0),
    default=None,
    help="Run-to-run SD of a cell's log median (0.04 = 4%), e.g. from A/A runs "
    "[default: estimated from several runs a side, else from --store, else 4% assumed].",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False),
    default=None,
    help="A trend store whose night-to-night noise for this scenario is the run-to-run noise.",
)
@click.option(
    "--force", is_flag=True, help="Compare runs of different scenarios or time scales anyway."
)
def compare(
    run_a: str,
    run_b: str,
    threshold: float,
    alpha: float,
    failure_margin: float,
    run_noise: float | None,
    store: str | None,
    force: bool,
) -> None:
    """Compare RUN_B against baseline RUN_A per arm, context size and turn.

    RUN_A and RUN_B are run folders, or several of one side joined by commas
    (runs/a1,runs/a2,runs/a3): the spread between a side's runs then measures the
    run-to-run noise. Each cell's ratio median TTFT B / A (failed requests count as
    slower than any) gets an interval from a paired bootstrap over sessions plus the
    run-to-run noise; a cell is SLOWER when B/A is surely above 1 + threshold or B
    surely fails more, after a Holm correction over cells; faster when surely below
    1 - threshold; no change when surely within 1 +- threshold (an equivalence test);
    else inconclusive, and always below 5 sessions.

    Exit status: 0 no change or faster, 1 some cell slower, 3 inconclusive (the runs
    cannot tell: add sessions or runs, or widen --threshold), 2 usage errors, including
    runs of different scenarios or time scales without --force.
    """
    from sessiongen import analysis

    side_a = [analysis.load_run(Path(p)).levels_apart() for p in _run_list(run_a)]
    side_b = [analysis.load_run(Path(p)).levels_apart() for p in _run_list(run_b)]
    noise = None
    if run_noise is not None:
        noise = analysis.RunNoise(run_noise, "given with --run-noise")
    elif store is not None and len(side_a) == len(side_b) == 1:
        from sessiongen.trend import store_run_noise

        noise = store_run_noise(Path(store), side_a[0])
    elif store is not None:
        click.echo("note: --store not read: several runs a side measure the noise themselves")
    result = analysis.compare_runs(
        side_a,
        side_b,
        threshold=threshold,
        alpha=alpha,
        failure_margin=failure_margin,
        force=force,
        run_noise=noise,
    )
    click.echo(result.to_text())
    if result.exit_code:
        raise SystemExit(result.exit_code)


def _run_list(text: str) -> list[str]:
    """RUN or RUN,RUN,...: the run folders of one side of a comparison."""
    parts = [p for p in text.split(",") if p]
    if not parts:
        raise RunDirError(f"{text!r}: expected a run folder or folders joined by commas")
    for part in parts:
        if Path(part).is_file():
            raise RunDirError(f"{part}: is a file, not a run folder")
    return parts
