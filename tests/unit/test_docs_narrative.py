"""Guides and concepts say how things are, not how they came to be: no dates and no
story of earlier versions (that is what Benchmarks holds), outside code."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

DOCS = ROOT / "docs"
#: A date, or a phrase that tells the history of a figure or of the code.
NARRATIVE = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\ban earlier (run|measurement|version)\b|\bthe previous fit\b"
    r"|\bthe first version\b|\bon the old code\b|\bused to\b|\bno longer\b|\bbefore the fix\b"
    r"|\bthe same day\b|\bthat evening\b",
    re.IGNORECASE,
)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INDENTED = re.compile(r"^(?: {4}|\t).*$", re.MULTILINE)
INLINE = re.compile(r"`[^`\n]*`")


def prose(markdown: str) -> str:
    """``markdown`` without fenced, indented and inline code (paths and commands may
    carry dates: a run folder is named by its day)."""
    return INLINE.sub("", INDENTED.sub("", FENCE.sub("", markdown)))


def narrative(markdown: str) -> list[str]:
    return [m.group(0) for m in NARRATIVE.finditer(prose(markdown))]


def test_the_pattern_finds_history_and_leaves_code_and_plain_words() -> None:
    text = (
        "Measured 2026-12-04 here. An earlier run gave 3%; the previous fit said so.\n"
        "It no longer queues.\n\n    bench/gpu/2026-12-07\n\nRun `runs/2026-12-07` now."
    )
    assert narrative(text) == ["2026-12-04", "An earlier run", "the previous fit", "no longer"]
    assert narrative("The fit's first term; the old value is kept") == []


def test_no_guide_or_concept_page_tells_history() -> None:
    pages = [*sorted((DOCS / "guides").glob("*.md")), *sorted((DOCS / "concepts").glob("*.md"))]
    pages += [DOCS / "getting-started.md", DOCS / "index.md"]
    found = {
        str(p.relative_to(ROOT)): hits
        for p in pages
        if (hits := narrative(p.read_text(encoding="utf-8")))
    }
    assert found == {}
