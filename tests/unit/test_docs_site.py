"""The docs site's hand-written pages against the code they describe."""

from __future__ import annotations

import ast
import re

from tests.support.paths import ROOT

DOCS = ROOT / "docs"


def test_the_architecture_page_states_every_layer_rule_the_layer_test_checks() -> None:
    """tests/unit/test_layers.py cites docs/architecture.md: each subpackage it keeps from
    importing another is named there with that rule."""
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    rules = page[page.index("## The layer rules") :]
    tree = ast.parse((ROOT / "tests" / "unit" / "test_layers.py").read_text(encoding="utf-8"))
    checked = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            first, second = node.elts
            if isinstance(first, ast.Constant) and isinstance(second, ast.Tuple):
                forbidden = [e.value for e in second.elts if isinstance(e, ast.Constant)]
                checked.append((first.value, forbidden))
    assert len(checked) >= 3
    for subpackage, forbidden in checked:
        line = next((li for li in rules.splitlines() if li.startswith(f"| `{subpackage}`")), "")
        assert line, f"docs/architecture.md has no rule row for {subpackage}"
        for module in forbidden:
            assert f"`{module.removeprefix('sessiongen.')}`" in line, (subpackage, module)


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
