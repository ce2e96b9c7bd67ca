"""The report's Problems and Limits as data (``report/cautions.json``) and the warning
that points the decision's reader to them.
"""

from __future__ import annotations

import json
from pathlib import Path

from sessiongen.report.document import (
    Element,
    Heading,
    Paragraph,
    Table,
)
from sessiongen.report.problems import LIMITS

#: The report's Problems and Limits as data (``report/cautions.json``), for the nightly
#: summary and the notebook: what the report leads with, said the same everywhere.
CAUTIONS_FILE = "cautions.json"


CAUTION_SECTIONS = {"Problems": "problems", LIMITS: "limits"}


def report_cautions(blocks: list[Element]) -> dict[str, list[str]]:
    """The warning paragraphs under the report's Problems and Limits headings."""
    out: dict[str, list[str]] = {name: [] for name in CAUTION_SECTIONS.values()}
    section = None
    for block in blocks:
        if isinstance(block, Heading) and block.level <= 2:
            section = CAUTION_SECTIONS.get(block.text)
        elif section and isinstance(block, Paragraph) and block.warning:
            out[section].append(block.text)
    return out


def read_cautions(report_dir: Path) -> dict[str, list[str]] | None:
    """A written report's Problems and Limits (None for reports written before them)."""
    path = report_dir / CAUTIONS_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: [str(t) for t in data.get(name, [])] for name in CAUTION_SECTIONS.values()}


def point_to_problems(blocks: list[Element]) -> None:
    """Right after the decision's table, a warning that the Problems or Limits below
    bear on it, when the report has any (the answer first, never without its caveats)."""
    cautions = report_cautions(blocks)
    parts = [
        f"the {len(found)} {kind if len(found) > 1 else kind[:-1]} under {title}"
        for kind, title, found in (
            ("problems", "Problems", cautions["problems"]),
            ("limits", LIMITS, cautions["limits"]),
        )
        if found
    ]
    start = next(
        (
            i
            for i, b in enumerate(blocks)
            if isinstance(b, Heading) and b.text.startswith("Decision")
        ),
        None,
    )
    if not parts or start is None:
        return
    end = next(
        (i for i in range(start + 1, len(blocks)) if isinstance(blocks[i], Heading)), len(blocks)
    )
    at = next((i for i in range(start + 1, end) if isinstance(blocks[i], Table)), end - 1)
    text = f"Read these verdicts with {' and '.join(parts)}, below."
    blocks.insert(at + 1, Paragraph(text, warning=True))
