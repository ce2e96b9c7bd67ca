"""The analysis notebook executes top to bottom against a run folder (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.synthetic import SyntheticSpec, write_run

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"


def execute_notebook(run_dir: Path, cwd: Path) -> nbformat.NotebookNode:
    """Run every cell with ``SESSIONGEN_RUN=run_dir``; raises on the first failing cell.

    Point it at any run folder (e.g. one made by the simulated pair) to check the
    notebook against real records.
    """
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SESSIONGEN_RUN", str(run_dir))
        client = NotebookClient(
            nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
        )
        client.execute()
    return nb


def _outputs(nb: nbformat.NotebookNode, mime: str) -> int:
    return sum(
        mime in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


def test_notebook_executes_against_a_synthetic_run(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", SyntheticSpec(contaminate=True, failing_sessions=1))
    nb = execute_notebook(run_dir, tmp_path)
    assert _outputs(nb, "image/png") >= 5  # speedup, median, CDF, attribution, sliced
    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert str(run_dir) in text and "SIMULATED" in text
    assert "Median TTFT per turn, modeled seconds" in text
    assert not any(
        out.get("output_type") == "error" for cell in nb.cells for out in cell.get("outputs", [])
    )


def test_notebook_is_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert "Slice it yourself" in nb.cells[-2].source and nb.cells[-1].cell_type == "code"


@pytest.mark.skipif(
    not os.environ.get("SESSIONGEN_TEST_RUN"), reason="set SESSIONGEN_TEST_RUN=RUN_DIR to run"
)
def test_notebook_executes_against_a_given_run(tmp_path: Path) -> None:
    """E.g. ``SESSIONGEN_TEST_RUN=runs/<id> pytest tests/test_notebook.py`` on a replay run."""
    nb = execute_notebook(Path(os.environ["SESSIONGEN_TEST_RUN"]).resolve(), tmp_path)
    assert _outputs(nb, "image/png") >= 5
