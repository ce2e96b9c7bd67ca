"""The package's layer rules (docs/architecture.md, "The layer rules"), read off the imports.

Every ``import`` and ``from ... import`` of every module of a subpackage counts, at any
depth (a function-level import hides a dependency as well as a top-level one), relative
imports resolved against the module's own package.
"""

from __future__ import annotations

import ast

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "sessiongen"


def imported_modules(source: str, package: str) -> set[str]:
    """Every module a module of ``package`` imports (``from a import b`` counts as ``a``
    and ``a.b``: ``b`` may be a module)."""
    tree = ast.parse(source)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def imports_of(subpackage: str) -> list[tuple[str, str]]:
    """``(file, module)`` for every import of every file of ``sessiongen.SUBPACKAGE``."""
    out = []
    files = sorted((PACKAGE / subpackage).rglob("*.py"))
    assert files, subpackage
    for path in files:
        package = ".".join(path.relative_to(ROOT).parts[:-1])
        for module in sorted(imported_modules(path.read_text(encoding="utf-8"), package)):
            out.append((str(path.relative_to(ROOT)), module))
    return out


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def offending(subpackage: str, forbidden: tuple[str, ...]) -> list[str]:
    """``file: module`` for every import of a forbidden package from ``subpackage``."""
    return [f"{f}: {m}" for f, m in imports_of(subpackage) if within(m, forbidden)]


@pytest.mark.parametrize(
    ("subpackage", "forbidden"),
    [
        # the planner runs beside replay, on the sim's engine, not on top of replay
        ("capacity", ("sessiongen.replay",)),
        # the design of a run (blocks, arrivals, placements) lies below both of them
        # (the workload's trace export reads its arrivals)
        (
            "design",
            (
                "sessiongen.replay",
                "sessiongen.capacity",
                "sessiongen.client",
                "sessiongen.workload",
            ),
        ),
        # the simulator serves prompts; it knows neither how they were made nor who sends
        # them (the tokenizer and the probe phrasing both use live below both: text)
        (
            "sim",
            (
                "sessiongen.workload",
                "sessiongen.replay",
                "sessiongen.capacity",
                "sessiongen.client",
            ),
        ),
        # one experiment, clock-free and I/O-free, that replay and the planner both drive
        (
            "experiment",
            (
                "sessiongen.replay",
                "sessiongen.capacity",
                "sessiongen.client",
                "sessiongen.sim",
                "sessiongen.targets",
            ),
        ),
        # the report renders; the planner calls it to write its own report, never the
        # other way (what both need is analysis': payoff, whatif, structure)
        ("report", ("sessiongen.capacity",)),
        # analysis reads records, never the client or replay (counter names: records)
        ("analysis", ("sessiongen.client", "sessiongen.replay")),
        # a format knows no statistics and no stage that writes it
        (
            "records",
            (
                "sessiongen.analysis",
                "sessiongen.report",
                "sessiongen.replay",
                "sessiongen.client",
                "sessiongen.capacity",
            ),
        ),
    ],
)
def test_no_import_across_a_layer(subpackage: str, forbidden: tuple[str, ...]) -> None:
    assert offending(subpackage, forbidden) == []


def test_no_module_takes_a_name_from_the_package_root() -> None:
    """``sessiongen``'s root is the front door, whose names load replay and report: a
    module of a stage that took a name from it (``__version__``, say) would point up at
    them. Modules are taken from it (``from sessiongen import analysis``); names are not."""
    found = []
    for path in sorted(PACKAGE.glob("*/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "sessiongen" and not node.level:
                found += [
                    f"{path.relative_to(ROOT)}: {alias.name}"
                    for alias in node.names
                    if not (PACKAGE / alias.name).is_dir()
                    and not (PACKAGE / f"{alias.name}.py").is_file()
                ]
    assert found == []


def test_infra_imports_only_errors_and_itself() -> None:
    """As its module map says: infrastructure every stage uses knows none of them."""
    allowed = ("sessiongen.errors", "sessiongen.infra")
    found = [
        f"{f}: {m}"
        for f, m in imports_of("infra")
        if within(m, ("sessiongen",)) and m != "sessiongen" and not within(m, allowed)
    ]
    assert found == []


def test_the_walk_sees_relative_and_nested_imports() -> None:
    """The checker itself: a relative import and a function-level import both count."""
    source = "from ..replay import runner\n\ndef f():\n    import sessiongen.replay.routing\n"
    found = imported_modules(source, "sessiongen.capacity")
    assert {"sessiongen.replay", "sessiongen.replay.runner", "sessiongen.replay.routing"} <= found
    assert imported_modules("from . import grid\n", "sessiongen.capacity") >= {
        "sessiongen.capacity.grid"
    }
