"""The analysis notebook executes top to bottom against a run folder (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support.paths import ROOT
from tests.support.synthetic import SyntheticSpec, write_run

NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


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


def test_notebook_executes_against_a_simulated_pair_run(tmp_path: Path) -> None:
    """The issue's contract: a run made by the simulated pair, every cell must pass.

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
    nb = execute_notebook(run_dir, tmp_path)
    assert _outputs(nb, "image/png") >= 5
    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert str(run_dir) in text
