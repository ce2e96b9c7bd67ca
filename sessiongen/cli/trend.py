"""``sessiongen trend``: the performance trend store."""

from __future__ import annotations

from pathlib import Path

import click

from sessiongen.cli.common import (
    STORE_OPTION,
)


@click.group("trend")
def trend() -> None:
    """The performance trend store: add runs, detect regressions, plot the history."""


WINDOW_OPTION = click.option(
    "--window", type=int, default=90, show_default=True, help="Newest nights to analyse."
)


@trend.command("add")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@STORE_OPTION
def trend_add(run_dirs: tuple[str, ...], store: str) -> None:
    """Add the summaries of RUN_DIRS to the store (adding a run twice changes nothing)."""
    from sessiongen import trend as trend_mod

    added = trend_mod.trend_add([Path(d) for d in run_dirs], Path(store))
    click.echo(f"added {len(added)} of {len(run_dirs)} runs to {store}")


def _metric_thresholds(items: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"expected METRIC=FRACTION, got {item!r}") from None
        if not sep:
            raise click.BadParameter(f"expected METRIC=FRACTION, got {item!r}")
    return out


@trend.command("check")
@STORE_OPTION
@click.option("--threshold", type=float, default=0.05, show_default=True)
@click.option("--min-nights", type=int, default=2, show_default=True)
@click.option(
    "--metric-threshold",
    multiple=True,
    metavar="METRIC=FRACTION",
    help="Per-metric threshold, e.g. ttft=0.08 or speedup=0.1 (repeatable).",
)
@WINDOW_OPTION
def trend_check(
    store: str, threshold: float, min_nights: int, metric_threshold: tuple[str, ...], window: int
) -> None:
    """Find level shifts per series; exit 1 when any regression is found.

    A regression is a shift to a worse level by more than the threshold that has
    lasted at least --min-nights nights; correctness divergences and contamination
    count at any size.
    """
    from sessiongen import trend as trend_mod

    result = trend_mod.trend_check(
        Path(store),
        threshold=threshold,
        min_nights=min_nights,
        per_metric_thresholds=_metric_thresholds(metric_threshold),
        window=window,
    )
    click.echo(result.table())
    if result.exit_code:
        raise SystemExit(result.exit_code)


@trend.command("plot")
@STORE_OPTION
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Folder for PNGs.")
@WINDOW_OPTION
def trend_plot(store: str, out: str, window: int) -> None:
    """One PNG per headline series with its detected levels and shifts."""
    from sessiongen import trend as trend_mod

    for path in trend_mod.trend_plot(Path(store), Path(out), window=window):
        click.echo(str(path))
