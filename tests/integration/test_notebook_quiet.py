"""The notebook's kernel is reached over IPC, not plain TCP: no ipykernel warning
"Kernel is running over TCP without encryption" on the user's terminal.

The kernel is a child process writing to this process's stderr file descriptor, so the
test captures at the descriptor (capfd), not sys.stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongen.report import notebook
from tests.support.synthetic import SyntheticSpec, write_run


def test_the_kernel_runs_without_the_plain_tcp_warning(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path / "run", SyntheticSpec(placements=("fixed",), sessions=5))
    out = notebook.run_notebook(run_dir, tmp_path / "nb.ipynb")
    assert out.exists()
    printed = capfd.readouterr()
    assert "without encryption" not in printed.err + printed.out
    assert "WARNING" not in printed.err
    assert notebook.KERNEL_TRANSPORT == "ipc"
    assert not list(Path(notebook.tempfile.gettempdir()).glob("sg-nb-*/k-*"))  # cleaned up
