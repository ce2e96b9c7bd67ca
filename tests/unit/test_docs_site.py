"""The docs site's hand-written pages against the code they describe."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

DOCS = ROOT / "docs"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.rglob("*.md"):
        assert page.relative_to(DOCS).as_posix() in nav, page


def test_every_shipped_scenario_is_in_the_scenarios_table() -> None:
    """Getting started lists the scenarios to copy: each top-level scenarios/*.toml once."""
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    table = page[page.index("| file | what |") :]
    table = table[: table.index("\n\n")]
    listed = {
        name
        for row in table.splitlines()[2:]
        for name in re.findall(r"`([\w.-]+\.toml)`", row.split("|")[1])
    }
    shipped = {p.name for p in (ROOT / "scenarios").glob("*.toml")}
    assert listed == shipped, f"missing: {shipped - listed}, not shipped: {listed - shipped}"
