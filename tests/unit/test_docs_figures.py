"""Figures the docs quote trace to a data file (``docs/data/*.json``, written by
``docs/figures.py`` from the run that produced them), and a quoted figure that disagrees
with its source fails here.

Docs pages quote figures as ``{{ NAME:KEY:FORMAT }}`` placeholders that the mkdocs hook
fills from the data file; the README, shown by GitHub as written, quotes them in sentences
rebuilt here from the same file.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.paths import ROOT

DOCS = ROOT / "docs"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


FIGURES = _module("figures")
DATA_FILES = sorted((DOCS / "data").glob("*.json"))


@pytest.mark.parametrize("path", DATA_FILES, ids=lambda p: p.stem)
def test_each_data_file_says_where_its_figures_come_from(path: Path) -> None:
    data = FIGURES.load(path.stem)
    # a file copied from an earlier run's printed output says where from, and that run's load
    load = "load_average" if data.get("recorded_from") else "load_average_after"
    for key in ("command", "run_id", "commit", "date", "machine", load):
        assert data[key], key
    assert len(data["commit"]) == 40 and data["figures"]
    assert path.stem in FIGURES.source_line(data) or data["command"] in FIGURES.source_line(data)


def test_every_figure_a_page_quotes_exists_in_its_data_file() -> None:
    quoted = 0
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        quoted += len(FIGURES.PLACEHOLDER.findall(text))
        FIGURES.fill(text)  # raises on an unknown data file or figure
    assert quoted >= 3


def test_an_unknown_figure_fails() -> None:
    with pytest.raises(KeyError, match="no figure"):
        FIGURES.fill("{{ demo:alternate.no_such_figure:.2f }}")
    with pytest.raises(KeyError, match="no docs/data"):
        FIGURES.fill("{{ nosuchrun:alternate.session_gain }}")


def demo_sentence(data: dict[str, Any]) -> str:
    """The README's demo sentence, rebuilt from ``docs/data/demo.json``."""
    f = data["figures"]

    def gain(placement: str) -> str:
        return (
            f"{f[placement + '.session_gain']:.2f}x "
            f"[{f[placement + '.session_gain_low']:.2f}, {f[placement + '.session_gain_high']:.2f}]"
        )

    return (
        f"the pool's whole-session gain is **{gain('alternate')}** when turns alternate "
        f"between the replicas ({f['alternate.verdict']} at {f['alternate.pays_at']:g}x) "
        f"and **{gain('fixed')}** when each session stays on one ({f['fixed.verdict']}); "
        f"turn 2 alone, the first on the other replica, is "
        f"{f['alternate.turn2.speedup']:.1f}x faster"
    )


def demo_time_sentence(data: dict[str, Any]) -> str:
    """The README's time of the demo's replay, rebuilt from ``docs/data/demo.json``."""
    wall, cores = data["wall_s"], data["machine"].split(",")[0]
    return (
        f"The replay takes about {round(wall / 60)} minutes on {cores} "
        f"({wall // 60} min {wall % 60} s here, load average "
        f"{data['load_average_after'][0]:g} when recorded)"
    )


def tier_times_sentence(data: dict[str, Any]) -> str:
    """The README's time of the last whole ``make test``, from ``docs/data/test-times.json``."""
    f = data["figures"]
    return (
        f"Its last whole run here took {f['total.min']:.1f} min on "
        f"{data['machine'].split(',')[0]}: the fast tier {f['test_fast.min']:.1f} min over two "
        f"workers, the real-stack tier {f['test_real.min']:.1f} min"
    )


def served_sentence(data: dict[str, Any]) -> str:
    """The README's served pair's sustained trace rate and the client's overhead at 1,000
    requests in flight, from ``docs/data/served-rate.json`` (``bench/served_rate.py``,
    ``bench/driver_overhead.py``)."""
    f = data["figures"]
    rate = f["served.off_8r_compiled.largest_rate"]
    row = f"served.off_8r_compiled_{f'{rate:g}'.replace('.', '_')}"
    late = f[f"{row}.arrival_late_p99_s"]
    on_time = "no arrival late" if late == 0 else f"arrivals late by {late * 1000:.0f} ms at p99"
    client = "client.in_flight_1000"
    return (
        f"On {data['machine'].split(',')[0]} at time scale 1, the served pair (8 simulated "
        f"replicas on the compiled engine, pool off) and the client held a Mooncake-shaped "
        f"trace at {rate:g} requests a second with {f[f'{row}.peak_in_flight']} requests in "
        f"flight and {on_time} (load average {f[f'{row}.load_before'][0]:g} at the start); "
        f"the client's added TTFT with 1,000 requests in flight was "
        f"{f[f'{client}.added_ttft_p99_ms']:.2f} ms at p99 (load average "
        f"{f[f'{client}.load_before'][0]:g})"
    )


def plan_trace_sentence(data: dict[str, Any]) -> str:
    """The README's plan speed beside Dynamo's offline replay, from
    ``docs/data/plan-trace.json`` (``bench/plan_trace.py``)."""
    f = data["figures"]
    one, both, dynamo = f["one_arm.wall_s"], f["both_arms.wall_s"], f["dynamo.wall_s"]
    cpu = f["dynamo.cpu_s"] / f["one_arm.cpu_s"]
    return (
        f"took {one:.2f} s for one cache arm against {dynamo:.2f} s for NVIDIA Dynamo 1.6.1's "
        f"offline replay of the same trace ({dynamo / one:.2f}x in wall time, {cpu:.2f}x in "
        f"CPU time), and {both:.2f} s for both "
        f"arms with the decision ({both / dynamo:.2f}x Dynamo's one arm), peak memory "
        f"{max(f['one_arm.peak_mib'], f['both_arms.peak_mib'])} MiB (load average "
        f"{max(f['one_arm.load'], f['both_arms.load'], f['dynamo.load']):g} or less)"
    )


def test_the_readme_quotes_its_figures_as_their_data_files_have_them() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    demo = FIGURES.load("demo")
    for expected in (
        f"In the demo below ({demo['date']}, ",
        demo_sentence(demo),
        demo_time_sentence(demo),
        tier_times_sentence(FIGURES.load("test-times")),
        served_sentence(FIGURES.load("served-rate")),
        plan_trace_sentence(FIGURES.load("plan-trace")),
    ):
        assert expected in readme, f"README should say: {expected}"
    assert "docs/assets/demo-speedup.png" in readme
    assert (DOCS / "assets" / "demo-speedup.png").stat().st_size > 10_000


def error_phrase(data: dict[str, Any]) -> str:
    """How the demo scenario's comment states a recorded run's measurement error."""
    f = data["figures"]
    return (
        f"at {f['time_scale']:g}: median cell {f['error.median_share']:.1%}, worst "
        f"{f['error.worst_share']:.1%}, {f['error.flagged']} of {f['error.cells']} cells "
        f"flagged, {data['wall_s']} s (load average {data['load_average_after'][0]:g})"
    )


def test_the_demo_scenario_states_its_error_as_recorded() -> None:
    # The time scale's comment gives the error it was chosen by: from the recorded runs at
    # the new scale and the old one, so it cannot drift from docs/benchmarks.md's table.
    from sessiongen import scenario

    path = ROOT / "scenarios" / "alt128k.toml"
    comments = " ".join(
        line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line
    )
    comments = " ".join(comments.split())
    demo, before = FIGURES.load("demo"), FIGURES.load("demo-before")
    assert scenario.load(path).target.sim.time_scale == demo["figures"]["time_scale"]
    for data in (demo, before, FIGURES.load("demo-busy")):
        assert error_phrase(data) in comments, f"alt128k.toml should say: {error_phrase(data)}"


def test_the_quick_start_pages_quote_their_times_from_data_files() -> None:
    # Typed by hand, they went stale: "about 5 minutes (5 min 24 s here)" and a fast tier
    # of 9 min 12 s stood beside data files that said otherwise.
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    quick = page.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for placeholder in ("{{ demo:@wall_s }}", "{{ test-times:total.min:.1f }}"):
        assert placeholder in quick
    filled = FIGURES.fill(quick)
    assert f"took {FIGURES.load('demo')['wall_s']} s in" in filled
    assert not re.search(r"\d+ min \d+ s", quick), "a time typed by hand"


def test_a_recorded_run_gives_its_figures_and_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessiongen import report
    from tests.support.synthetic import SyntheticSpec, write_run

    run_dir = write_run(tmp_path / "runs", SyntheticSpec(placements=("alternate", "fixed")))
    report.write_report(run_dir)
    monkeypatch.setattr(FIGURES, "DATA", tmp_path / "data")
    monkeypatch.setattr(FIGURES, "ASSETS", tmp_path / "assets")
    FIGURES.record(run_dir, "synthetic", "sessiongen replay x.toml", picture=True)
    data = FIGURES.load("synthetic")
    assert data["run_id"] == run_dir.name and data["command"] == "sessiongen replay x.toml"
    figures = data["figures"]
    # the planted effect: ON 4x faster on later turns with alternate, no effect with fixed
    assert figures["alternate.turn2.speedup"] > 2 > 1.3 > figures["fixed.turn2.speedup"]
    assert figures["alternate.verdict"] == "pays"
    assert figures["alternate.session_gain_low"] <= figures["alternate.session_gain"]
    text = FIGURES.fill("{{ synthetic:alternate.turn2.speedup:.1f }} from {{ synthetic:@source }}")
    assert text.startswith(f"{figures['alternate.turn2.speedup']:.1f} from `sessiongen replay")
    assert (tmp_path / "assets" / "synthetic-speedup.png").stat().st_size > 10_000


def test_a_bench_writes_its_figures_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FIGURES, "DATA", tmp_path)
    FIGURES.write("bench_x", command="python bench/x.py", figures={"speed_s": 1.25})
    data = FIGURES.load("bench_x")
    assert data["figures"] == {"speed_s": 1.25} and len(data["load_average_after"]) == 3
    assert data["date"] and data["machine"] and "recorded_from" not in data
    assert FIGURES.fill("{{ bench_x:speed_s:.1f }} s").startswith("1.2")


def test_a_code_placeholder_reads_the_code() -> None:
    from sessiongen.capacity.fit import MAD_TO_SD
    from sessiongen.capacity.modelerror import default_model_error

    text = "{{ code:sessiongen.capacity.fit.MAD_TO_SD:g }}, "
    text += "{{ code:sessiongen.capacity.modelerror.default_model_error.loaded:.3f }}"
    assert FIGURES.fill(text) == f"{MAD_TO_SD:g}, {default_model_error()['loaded']:.3f}"
    with pytest.raises(AttributeError):
        FIGURES.fill("{{ code:sessiongen.capacity.fit.NO_SUCH_NAME }}")
