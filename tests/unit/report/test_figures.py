"""Log axes label their ticks as plain numbers ("6x", "0.2"), never "6x10^0", in every
figure: the speedup curve, median TTFT, TTFT CDF, load sweeps, what-if and trend plots."""

from __future__ import annotations

import re

import polars as pl
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sessiongen.report import figures, plots
from tests.support.paths import ROOT

PLAIN = re.compile(r"^[0-9][0-9.]*x?$")


def visible_labels(ax: Axes, which: str) -> list[str]:
    """The tick labels drawn inside the axis' view, major and minor."""
    ax.figure.canvas.draw()
    axis = ax.yaxis if which == "y" else ax.xaxis
    low, high = sorted(axis.get_view_interval())
    out = []
    for minor in (False, True):
        for tick in axis.get_major_ticks() if not minor else axis.get_minor_ticks():
            text = tick.label1.get_text()
            if text and low <= tick.get_loc() <= high:
                out.append(text)
    return out


def assert_plain(labels: list[str]) -> None:
    assert labels, "no tick labels at all"
    odd = [label for label in labels if not PLAIN.match(label)]
    assert odd == [], odd


@pytest.mark.parametrize(
    ("low", "high", "suffix", "expected"),
    [
        (1.2, 9.9, "x", {"2x", "6x"}),  # less than a decade: the minor ticks are labelled
        (0.2, 0.55, "", {"0.2", "0.3", "0.5"}),
        (0.001, 50.0, "", {"0.01", "1", "10"}),  # many decades: decades only
        (1500.0, 300000.0, "", {"10000", "100000"}),
    ],
)
def test_a_log_axis_labels_ticks_as_plain_numbers(
    low: float, high: float, suffix: str, expected: set[str]
) -> None:
    _fig, (ax,) = figures.panels("t")
    ax.plot([1, 2], [low, high])
    figures.log_axis(ax, "y", suffix=suffix)
    labels = visible_labels(ax, "y")
    assert_plain(labels)
    assert expected <= set(labels), labels


def test_the_speedup_curve_spanning_under_a_decade_reads_6x() -> None:
    speedups = pl.DataFrame(
        {
            "placement": ["alternate"] * 3,
            "context_tokens": [2048] * 3,
            "turn": [1, 2, 3],
            "speedup": [1.3, 6.0, 9.0],
            "speedup_ci_low": [1.2, 5.5, 8.5],
            "speedup_ci_high": [1.4, 6.5, 9.9],
        }
    )
    fig = plots.speedup_figure(speedups, "note")
    labels = visible_labels(fig.axes[0], "y")
    assert_plain(labels)
    assert "6x" in labels, labels


def test_median_ttft_and_cdf_axes_are_plain() -> None:
    arms = pl.DataFrame(
        {
            "placement": ["fixed"] * 4,
            "cache": ["off", "off", "on", "on"],
            "context_tokens": [2048] * 4,
            "turn": [1, 2, 1, 2],
            "median_ttft_s": [0.3, 0.4, 0.3, 0.25],
            "ci_low_s": [0.28, 0.38, 0.28, 0.22],
            "ci_high_s": [0.32, 0.45, 0.33, 0.27],
        }
    )
    fig: Figure = plots.median_ttft_figure(arms, "note")
    assert_plain(visible_labels(fig.axes[0], "y"))
    requests = pl.DataFrame(
        {
            "placement": ["fixed"] * 4,
            "cache": ["off", "off", "on", "on"],
            "context_tokens": [2048] * 4,
            "status": ["ok"] * 4,
            "ttft_s": [0.3, 0.4, 0.22, 0.25],
        }
    )
    fig = plots.ttft_cdf_figure(requests, "note")
    assert_plain(visible_labels(fig.axes[0], "x"))


def test_every_log_axis_goes_through_figures_log_axis() -> None:
    """So a new figure cannot bring back matplotlib's "6x10^0" labels."""
    scaffolding = ROOT / "sessiongen" / "report" / "figures.py"
    direct = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "sessiongen").rglob("*.py"))
        if path != scaffolding
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"set_[xy]scale\(|\.loglog\(|\.semilog[xy]\(", line)
    ]
    assert direct == []
