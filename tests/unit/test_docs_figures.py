"""Figures the docs quote trace to a data file (``docs/data/*.json``, written by
``docs/figures.py`` from the run that produced them), and a quoted figure that disagrees
with its source fails here.

Docs pages quote figures as ``{{ NAME:KEY:FORMAT }}`` placeholders that the mkdocs hook
fills from the data file; the README, shown by GitHub as written, quotes them in sentences
rebuilt here from the same file.
"""

from __future__ import annotations

import importlib.util
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


def test_the_readme_quotes_the_demo_as_its_data_file_has_it() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    expected = demo_sentence(FIGURES.load("demo"))
    assert expected in readme, f"README should say: {expected}"
    assert "docs/assets/demo-speedup.png" in readme
    assert (DOCS / "assets" / "demo-speedup.png").stat().st_size > 10_000


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
