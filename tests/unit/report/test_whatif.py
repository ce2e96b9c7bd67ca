"""The what-if report reads at a glance: one colour per line, one line style per arm,
legends that name the varied key, whole levels printed whole, a Columns list that is
the table's, and report commands that work where plan ran."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from matplotlib.axes import Axes
from matplotlib.legend import Legend
from matplotlib.lines import Line2D

from sessiongen.analysis.whatif import Vary
from sessiongen.capacity.plan import plan
from sessiongen.capacity.sweep import SweepOptions
from sessiongen.records.run import load_run
from sessiongen.report.whatifplot import whatif_figure
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"
ALONE = ("driver.concurrency=1", 'design.blocks=["off", "on"]')


def section(report: str, heading: str) -> list[str]:
    """The lines of one ``## heading`` section."""
    body = report.split(f"## {heading}\n", 1)[1]
    return [line for line in body.split("\n## ", 1)[0].splitlines() if line.strip()]


def first_table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line[0] == "|"]
    return rows[0], rows[2:]


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A plan run from its own working folder with a relative runs folder, as a user
    types it: (where it ran, the plan folder, report.md)."""
    here = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(here)
        out = plan(
            SMOKE,
            overrides=(*ALONE, "load.levels=[1, 2]"),
            varies=[Vary("target.sim.replicas", ("2", "3"))],
            runs_dir=Path("runs"),
            sweep=SweepOptions(jobs=1),
            seeds=1,
            sensitivity=False,
        )
    return here, here / out, (here / out / "report" / "report.md").read_text()


def test_the_columns_list_is_the_tables_columns(planned: tuple[Path, Path, str]) -> None:
    _here, _out, report = planned
    header, _rows = first_table(section(report, "What if"))
    described = [line[2:].split(":", 1)[0] for line in section(report, "Columns")]
    assert described == header
    assert all(line.split(":", 1)[1].strip() for line in section(report, "Columns"))


def test_whole_load_levels_print_whole(planned: tuple[Path, Path, str]) -> None:
    _here, _out, report = planned
    for name in ("What if", "Per turn"):
        header, rows = first_table(section(report, name))
        levels = {row[header.index("load_level")] for row in rows}
        assert levels == {"1", "2"}, name


def test_report_commands_work_from_where_plan_ran(
    planned: tuple[Path, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    here, out, report = planned
    monkeypatch.chdir(here)
    commands = re.findall(r"sessiongen report (\S+)", "\n".join(section(report, "Configurations")))
    assert len(commands) == 2
    for path in commands:
        assert load_run(Path(path)).meta.target_kind == "plan"
        assert Path(path).resolve().parent == (out / "configs").resolve()


def synthetic(levels: tuple[float, ...] = (1.0,)) -> pl.DataFrame:
    """Two pool sizes x two turn counts (x levels), one placement: four lines' worth."""
    rows = [
        {
            "target.sim.pool_capacity_gib": pool,
            "sessions.turns": turns,
            "placement": "alternate",
            "context_tokens": 2048,
            "load_level": level,
            "session_gain": 1.0 + i / 10,
            "ttft_p50_off_s": 0.3,
            "ttft_p50_on_s": 0.1 + i / 100,
        }
        for i, (pool, turns, level) in enumerate(
            (p, t, lv) for p in ("16", "64") for t in ("2", "3") for lv in levels
        )
    ]
    return pl.DataFrame(rows)


VARIES = [Vary("target.sim.pool_capacity_gib", ("16", "64")), Vary("sessions.turns", ("2", "3"))]


def legends(ax: Axes) -> list[Legend]:
    return [c for c in ax.get_children() if isinstance(c, Legend)]


def test_each_line_has_its_colour_and_each_arm_its_style() -> None:
    fig = whatif_figure(synthetic(), VARIES, "note")
    gain, ttft = fig.axes[:2]
    gain_lines = [ln for ln in gain.get_lines() if ln.get_linestyle() != ":"]
    assert len({ln.get_color() for ln in gain_lines}) == 2  # one per turn count
    by_colour: dict[str, set[str]] = {}
    for ln in ttft.get_lines():
        by_colour.setdefault(str(ln.get_color()), set()).add(ln.get_linestyle())
    assert len(by_colour) == 2 and all(styles == {"--", "-"} for styles in by_colour.values())
    texts = {t.get_text() for lg in legends(ttft) for t in lg.get_texts()}
    assert {"pool off", "pool on", "turns=2", "turns=3"} <= texts
    (arms,) = [lg for lg in legends(ttft) if lg.get_title().get_text() == "cache arm"]
    glyphs = [h for h in arms.legend_handles if isinstance(h, Line2D)]
    assert len({(h.get_linestyle(), h.get_markerfacecolor()) for h in glyphs}) == 2


def test_legends_and_axes_name_what_varied_and_its_unit() -> None:
    fig = whatif_figure(synthetic(levels=(1.0, 8.0)), VARIES, "note", arrival="closed")
    gain, ttft = fig.axes[:2]
    texts = {t.get_text() for lg in legends(ttft) for t in lg.get_texts()}
    assert "turns=2, concurrency 1" in texts and "turns=3, concurrency 8" in texts
    assert not any("@" in t or "8.0" in t for t in texts)
    assert gain.get_xlabel() == "target.sim.pool_capacity_gib (GiB)"
    assert "modeled s" in ttft.get_ylabel() and "ratio" in gain.get_ylabel()
    title = fig.get_suptitle()
    assert "target.sim.pool_capacity_gib" in title and "sessions.turns" in title
    open_loop = whatif_figure(synthetic(levels=(0.5, 2.0)), VARIES, "note", arrival="poisson")
    texts = {t.get_text() for lg in legends(open_loop.axes[1]) for t in lg.get_texts()}
    assert "turns=2, 0.5 sessions/s" in texts


def test_a_one_arm_plan_over_a_wide_range_still_draws() -> None:
    """A design of one arm has no session gain and no OFF TTFT in any cell; over a range
    of 8x or more the axes are logarithmic. The figure draws the ON arm and says why the
    gain panel is empty (it raised on the null gains, then on log-scaling no data: the
    real-stack tier's heldout-cpu grid)."""
    frame = synthetic().with_columns(
        pl.col("target.sim.pool_capacity_gib").replace({"16": "0.01", "64": "2"}),
        pl.lit(None, dtype=pl.Float64).alias("session_gain"),
        pl.lit(None, dtype=pl.Float64).alias("ttft_p50_off_s"),
    )
    varies = [Vary("target.sim.pool_capacity_gib", ("0.01", "2")), VARIES[1]]
    fig = whatif_figure(frame, varies, "note")
    gain, ttft = fig.axes[:2]
    assert gain.get_xscale() == "log" and ttft.get_xscale() == "log"
    assert any("no session gain" in t.get_text() for t in gain.texts)
    on_points = [y for line in ttft.get_lines() for y in line.get_ydata() if y == y]
    assert len(on_points) == frame.height


def test_gains_of_cells_with_an_unstable_arm_are_ringed_and_named() -> None:
    frame = synthetic().with_columns(
        pl.Series("verdict", ["pays", "unstable (OFF queue grows)", "pays", "does not pay"])
    )
    fig = whatif_figure(frame, VARIES, "note")
    gain, ttft = fig.axes[:2]
    rings = [c for c in gain.collections if c.get_gid() == "unstable"]
    ringed = [tuple(float(v) for v in xy) for c in rings for xy in c.get_offsets()]
    assert ringed == [(16.0, 1.1)]  # the unstable cell's gain (pool 16, turns 3), and only it
    texts = {t.get_text() for lg in legends(ttft) for t in lg.get_texts()}
    assert "unstable: a queue grows" in texts
    stable = whatif_figure(synthetic(), VARIES, "note")
    texts = {t.get_text() for lg in legends(stable.axes[1]) for t in lg.get_texts()}
    assert "unstable: a queue grows" not in texts


def test_a_key_that_sets_the_load_level_draws_one_line_along_it() -> None:
    """``--find load.levels``: each value is its cells' load level, so the level is the x
    axis, not a line per level (one point each, a legend of every value)."""
    levels = ("0.01", "0.02", "0.04")
    frame = pl.DataFrame({
        "load.levels": levels, "placement": ["alternate"] * 3, "context_tokens": [2048] * 3,
        "load_level": [0.01, 0.02, 0.04], "session_gain": [1.5, 2.0, 3.0],
        "ttft_p50_off_s": [1.0, 2.0, 4.0], "ttft_p50_on_s": [0.5, 0.6, 0.7],
    })  # fmt: skip
    fig = whatif_figure(frame, [Vary("load.levels", levels)], "note", arrival="poisson")
    gain = fig.axes[0]
    assert any(list(ln.get_ydata()) == [1.5, 2.0, 3.0] for ln in gain.get_lines())
    assert "one line per" not in fig.get_suptitle()


def test_placements_planned_alike_in_every_cell_are_named_and_any_difference_is_not() -> None:
    from sessiongen.report.whatif import ALIKE, placements_alike

    def rows(second: float) -> pl.DataFrame:
        base = {c: 1.5 for c in ALIKE}
        return pl.DataFrame(
            [
                {"config": 0, "placement": "alternate", **base},
                {"config": 0, "placement": "fixed", **base},
                {"config": 0, "placement": "router:cache_aware", **{c: 2.0 for c in ALIKE}},
                {"config": 1, "placement": "alternate", **base},
                {"config": 1, "placement": "fixed", **base, "session_gain_high": second},
            ]
        )

    assert placements_alike(rows(1.5)) == ["alternate", "fixed"]  # the router is not a client's
    assert placements_alike(rows(1.5000001)) == []  # one cell apart: placement mattered there
    assert placements_alike(rows(1.5).filter(pl.col("placement") != "fixed")) == []
