"""The executed notebook as one HTML page, and ``sessiongen notebook``'s one-line errors
(no kernel needed here; tests/integration/test_notebook.py executes it)."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
from click.testing import CliRunner

from sessiongen.cli import cli
from sessiongen.report.notebook import markdown_html, notebook_html, notebook_source
from tests.support.paths import ROOT
from tests.support.synthetic import SyntheticSpec, write_run

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def executed() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(run_dir)\ndisplay(fig)\nframe")
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="runs/x <b>\n"),
        nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Fig>"}),
        nbformat.v4.new_output(
            "execute_result", data={"text/html": "<table><tr><td>1</td></tr></table>"}
        ),
        nbformat.v4.new_output(
            "error",
            ename="ZeroDivisionError",
            evalue="x",
            traceback=["\x1b[31mZeroDivisionError\x1b[0m: x"],
        ),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# Title\n\nSome `code` and **bold** <x>."), code]
    return nb


def test_outputs_become_one_self_contained_page() -> None:
    page = notebook_html(executed(), "t")
    assert page.startswith("<!DOCTYPE html>") and "<title>t</title>" in page
    assert "<h1>Title</h1>" in page
    assert "<p>Some <code>code</code> and <strong>bold</strong> &lt;x&gt;.</p>" in page
    assert '<pre class="code">print(run_dir)\ndisplay(fig)\nframe</pre>' in page
    assert '<pre class="stream">runs/x &lt;b&gt;\n</pre>' in page  # text is escaped
    assert f'<img src="data:image/png;base64,{PNG}" alt="&lt;Fig&gt;">' in page
    assert '<div class="output"><table><tr><td>1</td></tr></table></div>' in page
    assert '<pre class="error">ZeroDivisionError: x</pre>' in page  # ANSI colours dropped
    assert page.count("src=") == 1 and "http" not in page  # nothing linked from elsewhere


def test_markdown_keeps_indented_commands_and_lists() -> None:
    text = "Run it:\n\n    sessiongen notebook runs/<id>\n    -o out.ipynb\n\n- one\n- two"
    assert markdown_html(text) == (
        "<p>Run it:</p>\n<pre>sessiongen notebook runs/&lt;id&gt;\n-o out.ipynb</pre>\n"
        "<ul><li>one</li><li>two</li></ul>"
    )


def test_the_notebook_is_found_in_the_repository() -> None:
    assert notebook_source() == ROOT / "notebooks" / "analysis.ipynb"


def test_bad_output_or_run_folder_is_one_line_exit_2(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", SyntheticSpec(placements=("alternate",), turns=2))
    runner = CliRunner()
    bad = runner.invoke(cli, ["notebook", str(run_dir), "-o", str(tmp_path / "out.pdf")])
    assert bad.exit_code == 2
    assert "out.pdf: expected a file ending in .html or .ipynb" in bad.output
    missing = runner.invoke(cli, ["notebook", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "nope" in missing.output
    assert "Traceback" not in bad.output + missing.output
    assert not (run_dir / "report").exists()  # nothing written before the checks
