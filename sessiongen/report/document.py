"""A small document model rendered to Markdown and to one self-contained HTML file.

The report is built once as a list of elements and rendered twice, so ``report.md`` and
``report.html`` always say the same thing. Markdown links images by relative path; HTML
embeds them as base64 data URIs so the file can be mailed or archived on its own.
Text is plain (no inline markup) and escaped for each format.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str
    warning: bool = False  # rendered bold (Markdown) or highlighted (HTML)


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    frame: pl.DataFrame
    max_rows: int = 60


@dataclass(frozen=True)
class Image:
    path: Path
    alt: str


Element = Heading | Paragraph | Bullets | Table | Image

CSS = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.5rem 0 1.2rem; font-size: 0.85rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
.warning { background: #fff1f0; border-left: 4px solid #d62728; padding: 0.4rem 0.8rem; }
"""


def format_value(value: Any) -> str:
    """A cell as text: 3 decimals for floats (3 significant digits when tiny), '-' for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if 0 < abs(value) < 0.01 else f"{value:.3f}"
    return str(value)


def _rows(table: Table) -> tuple[list[str], list[list[str]], int]:
    frame = table.frame
    shown = frame.head(table.max_rows)
    rows = [[format_value(v) for v in row] for row in shown.iter_rows()]
    return list(frame.columns), rows, frame.height - shown.height


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(elements: Sequence[Element], base: Path) -> str:
    """Render as Markdown; image paths are written relative to ``base``."""
    out: list[str] = []
    for block in elements:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            out.append(f"**{block.text}**" if block.warning else block.text)
        elif isinstance(block, Bullets):
            out.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            header, rows, hidden = _rows(block)
            lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
            lines.append("|" + "|".join("---" for _ in header) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            if hidden:
                lines.append(f"\n({hidden} more rows not shown)")
            out.append("\n".join(lines))
        else:
            rel = block.path.relative_to(base) if block.path.is_relative_to(base) else block.path
            out.append(f"![{block.alt}]({rel.as_posix()})")
    return "\n\n".join(out) + "\n"


def _html_element(block: Element) -> str:
    esc = html.escape
    if isinstance(block, Heading):
        return f"<h{block.level}>{esc(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        cls = ' class="warning"' if block.warning else ""
        return f"<p{cls}>{esc(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{esc(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        header, rows, hidden = _rows(block)
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
        more = f"<p>({hidden} more rows not shown)</p>" if hidden else ""
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"
    data = base64.b64encode(block.path.read_bytes()).decode("ascii")
    return f'<p><img alt="{esc(block.alt)}" src="data:image/png;base64,{data}"></p>'


def to_html(elements: Sequence[Element], title: str) -> str:
    """Render as one HTML page with styles inline and PNG images embedded."""
    body = "\n".join(_html_element(b) for b in elements)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )
