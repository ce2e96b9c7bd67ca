"""``sessiongen notebook RUN_DIR``: the analysis notebook executed on one run folder.

The notebook (``notebooks/analysis.ipynb``; installed as ``sessiongen/report/analysis.ipynb``
from a wheel) is read into memory and executed with nbclient in a fresh kernel whose
environment names the run (``SESSIONGEN_RUN``), so any run folder works and the
notebook in the repository is never written. The executed copy goes to ``-o OUT``:

- ``OUT.ipynb``: the notebook with its outputs, for Jupyter or an editor;
- ``OUT.html`` (the default, ``RUN_DIR/report/analysis.html``): one self-contained page
  (:func:`notebook_html`), figures embedded, readable with nothing else installed.

The HTML is rendered here, not by nbconvert: a notebook of markdown, code, text,
figures and polars tables needs four output kinds, while nbconvert would add about ten
packages (jinja2, mistune, bleach, tinycss2, beautifulsoup4, pandocfilters, ...) to the
install for one page. Markdown cells get a small subset (headings, paragraphs, lists,
indented code, ``code``, **bold**), which is all the notebook uses.

A cell that fails still leaves the output written, with the error in it, and raises
:class:`~sessiongen.errors.RunFailedError` (exit status 1).
"""

from __future__ import annotations

import html
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from sessiongen.errors import MissingDependencyError, OutputError, RunFailedError
from sessiongen.infra.files import atomic_write_bytes, check_writable
from sessiongen.records import io
from sessiongen.records.run import RUN_ENV_VAR
from sessiongen.report.document import CSS

NOTEBOOK_NAME = "analysis.ipynb"
#: Where ``sessiongen notebook RUN_DIR`` writes without ``-o``.
DEFAULT_OUTPUT = Path("report") / "analysis.html"
SUFFIXES = (".html", ".ipynb")
#: Seconds any one cell may take (a large run's bootstrap takes tens).
CELL_TIMEOUT_S = 600
#: Seconds the kernel may take to start: nbclient's 60 s default was missed on a loaded
#: 2-core machine (load average about 9, the fast tier's two workers beside other jobs).
KERNEL_START_S = 300
#: How the kernel is reached (:func:`run_notebook`).
KERNEL_TRANSPORT = "ipc"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def notebook_source() -> Path:
    """The analysis notebook: the installed copy, else the repository's."""
    packaged = Path(__file__).with_name(NOTEBOOK_NAME)
    if packaged.is_file():
        return packaged
    repo = Path(__file__).resolve().parents[2] / "notebooks" / NOTEBOOK_NAME
    if repo.is_file():
        return repo
    raise MissingDependencyError(f"{repo}: the analysis notebook is not installed")


def run_notebook(
    run_dir: str | Path, output: str | Path | None = None, *, timeout_s: int = CELL_TIMEOUT_S
) -> Path:
    """Execute the analysis notebook on ``run_dir`` and write it to ``output`` (``.html``
    or ``.ipynb``; default ``RUN_DIR/report/analysis.html``); return the path written."""
    try:
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
        from traitlets.config import Config
    except ImportError as exc:
        raise MissingDependencyError(
            f"sessiongen notebook needs nbclient, nbformat and ipykernel ({exc.name} is "
            "missing): pip install 'sessiongen[notebook]'"
        ) from None
    path = Path(run_dir)
    io.read_meta(path)  # a one-line error for a folder that is not a run
    out = check_writable(Path(output) if output is not None else path / DEFAULT_OUTPUT)
    if out.suffix.lower() not in SUFFIXES:
        raise OutputError(f"{out}: expected a file ending in .html or .ipynb")
    nb = nbformat.read(notebook_source(), as_version=4)  # type: ignore[no-untyped-call]
    failed: str | None = None
    # IPC (Unix sockets in a private temporary folder), not TCP on localhost: nothing but
    # this user can reach the kernel, and ipykernel has no plain-TCP warning to print
    # ("Kernel is running over TCP without encryption") on every run. The socket path is
    # absolute (the kernel runs in the run folder, the client here) and short (Unix
    # sockets allow about 100 bytes).
    with tempfile.TemporaryDirectory(prefix="sg-nb-") as sockets:
        transport = {"transport": KERNEL_TRANSPORT, "ip": str(Path(sockets) / "k")}
        client = NotebookClient(
            nb,
            timeout=timeout_s,
            startup_timeout=KERNEL_START_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(path)}},
            config=Config({"KernelManager": transport}),
        )
        try:
            client.execute(env=kernel_env(path))
        except CellExecutionError as exc:
            failed = _first_line(str(exc))
    if out.suffix.lower() == ".ipynb":
        atomic_write_bytes(out, nbformat.writes(nb).encode())  # type: ignore[no-untyped-call]
    else:
        atomic_write_bytes(out, notebook_html(nb, f"sessiongen notebook: {path.name}").encode())
    if failed is not None:
        raise RunFailedError(f"{out}: written, but a cell failed: {failed}")
    return out


def kernel_env(run_dir: Path) -> dict[str, str]:
    """The kernel's environment: this one, the run named, this sessiongen importable."""
    env = dict(os.environ)
    env[RUN_ENV_VAR] = str(run_dir.resolve())
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _first_line(text: str) -> str:
    """The error's own line of a cell failure (nbclient's message starts with the code)."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    named = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return (named or [line for line in lines if line] or ["unknown error"])[-1][:300]


# HTML -------------------------------------------------------------------------------------

_EXTRA_CSS = """
pre { background: #f7f7f7; padding: 0.5rem; overflow-x: auto; font-size: 0.85rem; }
pre.code { border-left: 3px solid #9ecae1; }
pre.stderr { background: #fff8e6; }
pre.error { background: #fff1f0; border-left: 4px solid #d62728; }
.output table { border-collapse: collapse; font-size: 0.8rem; }
"""


def notebook_html(nb: Any, title: str) -> str:
    """An executed notebook (an nbformat node) as one self-contained HTML page."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(markdown_html(cell.source))
        elif cell.cell_type == "code":
            parts.append(f'<pre class="code">{html.escape(cell.source)}</pre>')
            parts += [_output_html(out) for out in cell.get("outputs", [])]
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{CSS}{_EXTRA_CSS}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def _output_html(out: Any) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        cls = "stderr" if out.get("name") == "stderr" else "stream"
        return f'<pre class="{cls}">{html.escape(_text(out.get("text")))}</pre>'
    if kind == "error":
        trace = _ANSI.sub("", "\n".join(out.get("traceback") or []))
        head = f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"
        return f'<pre class="error">{html.escape(trace or head)}</pre>'
    data = out.get("data") or {}
    if "image/png" in data:
        png = _text(data["image/png"]).replace("\n", "")
        if not _BASE64.fullmatch(png):  # only base64 goes into the attribute
            return ""
        alt = html.escape(_text(data.get("text/plain", "figure")))
        return f'<p><img src="data:image/png;base64,{png}" alt="{alt}"></p>'
    if "text/html" in data:  # the kernel's own rendering (polars frames)
        return f'<div class="output">{_text(data["text/html"])}</div>'
    if "text/plain" in data:
        return f"<pre>{html.escape(_text(data['text/plain']))}</pre>"
    return ""


def _text(value: Any) -> str:
    """Notebook text fields are a string or a list of lines."""
    return "".join(value) if isinstance(value, list) else str(value or "")


def markdown_html(source: str) -> str:
    """The markdown the notebook uses: ``#`` headings, paragraphs, ``-`` lists, blocks
    indented four spaces (code), inline ``code`` and **bold**; everything else is shown
    as its text, escaped."""
    out = []
    for block in re.split(r"\n\s*\n", source.strip("\n")):
        lines = block.splitlines()
        heading = re.match(r"^(#{1,6})\s+(.*)", lines[0]) if lines else None
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            lines = lines[1:]
        if not lines:
            continue
        if all(line.startswith("    ") for line in lines):
            code = "\n".join(line[4:] for line in lines)
            out.append(f"<pre>{html.escape(code)}</pre>")
        elif all(line.lstrip().startswith(("- ", "* ")) for line in lines):
            items = "".join(f"<li>{_inline(line.lstrip()[2:])}</li>" for line in lines)
            out.append(f"<ul>{items}</ul>")
        else:
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(out)


def _inline(text: str) -> str:
    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
