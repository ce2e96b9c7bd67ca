"""``sessiongen notebook RUN_DIR``: the analysis notebook executed top to bottom on any run
folder, written where asked, the repository's copy untouched, the report's Problems and
Limits shown word for word."""

from __future__ import annotations

import hashlib
import html
import os
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner

from sessiongen import report
from sessiongen.cli import cli
from sessiongen.errors import RunFailedError
from sessiongen.report import notebook
from tests.support.paths import ROOT
from tests.support.synthetic import SyntheticSpec, write_run

NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


def repo_notebooks() -> dict[str, str]:
    """Every file under notebooks/ with its digest: what executing must leave alone."""
    return {
        str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((ROOT / "notebooks").rglob("*"))
        if p.is_file()
    }


def outputs(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def printed(nb: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in outputs(nb))


def caution_lines(cautions: dict[str, list[str]]) -> str:
    """The notebook's Problems-first cell prints exactly this for the report's cautions."""
    lines = []
    for title, key in (("Limits of this run", "limits"), ("Problems", "problems")):
        lines += [f"{title}:", *(f"- {t}" for t in cautions[key] or ["none found"])]
    return "\n".join(lines) + "\n"


def test_notebook_is_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert "Slice it yourself" in nb.cells[-2].source and nb.cells[-1].cell_type == "code"
    assert "sessiongen notebook runs/<run-id>" in nb.cells[0].source


def test_notebook_command_runs_a_run_without_report_and_shows_its_cautions(
    tmp_path: Path,
) -> None:
    """The reported case: no report yet, the run outside the repo's runs/, no
    SESSIONGEN_RUN in the environment; the notebook must still show the Problems and
    Limits the report then leads with."""
    spec = SyntheticSpec(
        placements=("alternate",), sessions=5, turns=3, contaminate=True, failing_sessions=1
    )
    run_dir = write_run(tmp_path / "elsewhere", spec)
    before = repo_notebooks()
    out = tmp_path / "out" / "executed.ipynb"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SESSIONGEN_RUN", raising=False)
        result = CliRunner().invoke(cli, ["notebook", str(run_dir), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(f"notebook: {out}")
    assert repo_notebooks() == before  # the repository's notebook is never written
    assert not (run_dir / "report").exists()  # nor the run folder, with -o elsewhere
    nb = nbformat.read(out, as_version=4)
    assert not any(o.get("output_type") == "error" for o in outputs(nb))
    assert sum("image/png" in o.get("data", {}) for o in outputs(nb)) >= 5
    text = printed(nb)
    assert str(run_dir) in text and "SIMULATED" in text
    assert "Median TTFT per turn, modeled seconds" in text
    # replay's own summary, from the library call the CLI makes (sessiongen.outcome)
    assert "Decision: does the pool pay (session gain >= 1.1)?" in text
    # The report's Problems and Limits, word for word (computed as the report would:
    # tests/unit/report/test_report.py checks that against a written report).
    cautions = report.run_cautions(run_dir)
    assert cautions["problems"] and caution_lines(cautions) in text
    assert not (run_dir / "report").exists()


def test_notebook_on_a_simulated_pair_run_writes_one_html_page(tmp_path: Path) -> None:
    """A run the simulated pair made: the default output is RUN_DIR/report/analysis.html
    with every figure embedded and the report's cautions.

    ``SESSIONGEN_TEST_RUN=runs/<id>`` points it at an existing run instead.
    """
    given = os.environ.get("SESSIONGEN_TEST_RUN")
    if given:
        run_dir = Path(given).resolve()
    else:
        from sessiongen import replay, scenario

        sc = scenario.load(
            ROOT / "scenarios" / "smoke.toml",
            ["target.sim.time_scale=0.05", 'placement.policies=["alternate","fixed"]'],
        )
        outcome = replay.replay(
            sc, replay.ReplayOptions(runs_dir=tmp_path / "runs", progress=False)
        )
        assert outcome.failed == 0
        run_dir = outcome.run_dir
    written = notebook.run_notebook(run_dir)
    assert written == run_dir / "report" / "analysis.html"
    page = written.read_text(encoding="utf-8")
    assert page.count('<img src="data:image/png;base64,') >= 5
    assert '<pre class="error">' not in page
    cautions = report.run_cautions(run_dir)
    assert cautions["limits"]  # 2 sessions: too few for the intervals
    shown = [html.escape(text) for texts in cautions.values() for text in texts]
    assert all(text in page for text in shown)


def test_a_failing_cell_is_written_with_its_error_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel is told the run (SESSIONGEN_RUN), whatever this process's environment."""
    run_dir = write_run(tmp_path / "runs", SyntheticSpec(placements=("alternate",), turns=2))
    small = nbformat.v4.new_notebook()
    small.cells = [
        nbformat.v4.new_code_cell("import os\nprint(os.environ['SESSIONGEN_RUN'])"),
        nbformat.v4.new_code_cell("1 / 0"),
    ]
    source = tmp_path / "small.ipynb"
    nbformat.write(small, source)
    monkeypatch.setattr(notebook, "notebook_source", lambda: source)
    monkeypatch.setenv("SESSIONGEN_RUN", "/not/this/one")
    out = tmp_path / "small-out.ipynb"
    with pytest.raises(RunFailedError, match=r"small-out\.ipynb: written, but a cell failed: "):
        notebook.run_notebook(run_dir, out)
    nb = nbformat.read(out, as_version=4)
    assert nb.cells[0].outputs[0]["text"] == f"{run_dir.resolve()}\n"
    assert nb.cells[1].outputs[0]["ename"] == "ZeroDivisionError"
