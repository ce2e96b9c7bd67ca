"""Docs and docstrings speak to users: no issue numbers of a tracker the repository does
not hold ("issue 22 item 3", "the issue's pressure32k")."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

#: A reference to the tracker: "issue 22", "issue #22", "Issue 22's", "the issue's".
TRACKER = re.compile(r"\b[Ii]ssues? #?\d+|\bthe issue'?s?\b", re.IGNORECASE)


def references(text: str) -> list[str]:
    return [m.group(0) for m in TRACKER.finditer(text)]


def test_the_pattern_finds_what_it_is_for_and_leaves_other_words() -> None:
    assert references("(issue 22 item 3) and Issue 31's and issue #4") == [
        "issue 22",
        "Issue 31",
        "issue #4",
    ]
    assert references("the issue's pressure32k") == ["the issue's"]
    assert references("a tissue of issues to fix; BLIS PR #480") == []


def test_no_doc_page_readme_or_module_cites_the_tracker() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "sessiongen").rglob("*.py"))
    files += sorted((ROOT / "sessiongen").rglob("*.pyx"))
    # the benches', scenarios' and tests' docstrings and comments are docs too
    for folder in ("bench", "scenarios", "scripts", "tests"):
        for pattern in ("*.py", "*.md", "*.toml", "*.sh"):
            files += sorted((ROOT / folder).rglob(pattern))
    files = [p for p in files if p.name != "test_no_tracker_refs.py"]
    found = {
        str(p.relative_to(ROOT)): refs
        for p in files
        if (refs := references(p.read_text(encoding="utf-8")))
    }
    assert found == {}
