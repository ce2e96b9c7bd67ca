"""The package's layer rules, read from the table in docs/architecture.md ("The layer
rules") and checked against the imports, so the picture and the test cannot disagree.

Every ``import`` and ``from ... import`` of every module of a subpackage counts, at any
depth (a function-level import hides a dependency as well as a top-level one), relative
imports resolved against the module's own package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.support.paths import ROOT

PACKAGE = ROOT / "sessiongen"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: Root modules any stage may import: not stages.
ROOT_MODULES = ("errors", "_version")
#: The longest a module may grow before it is split (lines).
MOST_LINES = 600


def layer_table(text: str) -> dict[str, frozenset[str]]:
    """The table between the ``layer-table`` markers: subpackage -> what it may import."""
    body = text.split("<!-- layer-table", 1)[1].split("<!-- /layer-table -->", 1)[0]
    out: dict[str, frozenset[str]] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue  # the comment, the header, the rule under it
        name = cells[0].strip("`")
        assert name not in out, f"{name}: two rows"
        out[name] = frozenset(re.findall(r"`([a-z_]+)`", cells[1]))
    return out


def subpackages() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def stage_of(module: str) -> str | None:
    """The subpackage or root module ``module`` lies in ("" for the root itself);
    None outside sessiongen."""
    if module == "sessiongen":
        return ""
    if module.startswith("sessiongen."):
        return module.split(".")[1]
    return None


def imported(source: str, package: str) -> set[str]:
    """Every sessiongen module a module of ``package`` imports, by what it names:
    ``from sessiongen import analysis`` is ``sessiongen.analysis``, ``from sessiongen
    import load_run`` and ``import sessiongen`` the package root (``sessiongen``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            if base == "sessiongen":
                for alias in node.names:
                    is_module = (PACKAGE / alias.name).is_dir() or (
                        PACKAGE / f"{alias.name}.py"
                    ).is_file()
                    out.add(f"sessiongen.{alias.name}" if is_module else "sessiongen")
            else:
                out.add(base)
    return out


def violations(
    subpackage: str, sources: Iterable[tuple[str, str]], table: Mapping[str, frozenset[str]]
) -> list[str]:
    """``file: module`` for each import of ``sources`` (``(path relative to the root,
    text)`` of modules of ``sessiongen.SUBPACKAGE``) that the table does not allow."""
    allowed = table[subpackage] | {subpackage, *ROOT_MODULES}
    out = []
    for path, text in sources:
        package = ".".join(Path(path).parts[:-1])
        for module in sorted(imported(text, package)):
            stage = stage_of(module)
            if stage is None:
                continue
            if stage == "":
                out.append(f"{path}: sessiongen (the package root)")
            elif stage not in allowed:
                out.append(f"{path}: {module}")
    return out


def sources_of(subpackage: str) -> list[tuple[str, str]]:
    files = sorted((PACKAGE / subpackage).rglob("*.py"))
    assert files, subpackage
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files]


TABLE = layer_table(ARCHITECTURE.read_text(encoding="utf-8"))


def test_the_table_has_one_row_for_every_subpackage_and_names_only_real_ones() -> None:
    assert sorted(TABLE) == subpackages()
    names = set(subpackages()) | set(ROOT_MODULES)
    assert {m for allowed in TABLE.values() for m in allowed} <= names


def test_every_import_is_one_the_table_allows() -> None:
    found = [v for sub in subpackages() for v in violations(sub, sources_of(sub), TABLE)]
    assert found == []


def test_the_check_fails_on_each_break_it_exists_for() -> None:
    """Planted: replay reaching down to the report stage, the planner taking a model's
    shape from the launcher, a stage importing the package root; and their mends pass."""
    planted = {
        "replay": "from sessiongen.analysis import payoff\nfrom sessiongen.report import x\n",
        "capacity": "def f():\n    from sessiongen.launch.tinymodel import RECIPES\n",
        "report": "import sessiongen\n",
    }
    for sub, text in planted.items():
        found = violations(sub, [(f"sessiongen/{sub}/planted.py", text)], TABLE)
        assert found, sub
    assert violations(
        "report", [("sessiongen/report/p.py", "from sessiongen import load_run\n")], TABLE
    )
    mends = {
        "outcome": "from sessiongen.report.decision import decide\n",
        "capacity": "from sessiongen.scenario.models import RECIPES\n",
        "report": "from sessiongen import analysis\nfrom . import figures\n",
    }
    for sub, text in mends.items():
        assert violations(sub, [(f"sessiongen/{sub}/mended.py", text)], TABLE) == [], sub


def test_relative_and_nested_imports_count() -> None:
    source = "from ..replay import runner\n\ndef f():\n    import sessiongen.replay.routing\n"
    found = imported(source, "sessiongen.capacity")
    assert {"sessiongen.replay", "sessiongen.replay.routing"} <= found
    assert imported("from . import grid\n", "sessiongen.capacity") == {"sessiongen.capacity"}


def test_a_table_row_read_back() -> None:
    text = (
        "<!-- layer-table -->\n| a | b | c |\n| --- | --- | --- |\n"
        "| `x` | `y`, `z` | w |\n| `v` | - | u |\n<!-- /layer-table -->"
    )
    assert layer_table(text) == {"x": frozenset({"y", "z"}), "v": frozenset()}


def test_no_module_over_the_line_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    }
    assert long == {}
