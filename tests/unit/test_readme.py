"""The README's statements about what the code writes, checked against the code.

The README listed ``summary.csv`` columns that the file did not carry; these tests read
the documented lists out of the README, so a column added or dropped on one side only
fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from sessiongen import report
from sessiongen.records.format import REQUEST_SCHEMA
from tests.support.paths import ROOT
from tests.support.synthetic import SyntheticSpec, write_run

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _paragraph(marker: str) -> str:
    start = README.index(marker)
    return README[start : README.index("\n\n", start)]


def _names(text: str) -> list[str]:
    """Backticked identifiers, in order, parenthesized remarks left out."""
    without = re.sub(r"\([^)]*\)", "", text)
    return re.findall(r"`([a-z_][a-z0-9_]*)`", without)


def test_summary_csv_columns_are_the_documented_ones(tmp_path: Path) -> None:
    columns = _names(_paragraph("`summary.csv` columns, in order"))
    assert columns == list(report.SUMMARY_COLUMNS)
    run_dir = write_run(tmp_path, SyntheticSpec(placements=("alternate",), turns=2))
    header = (report.write_report(run_dir).parent / "summary.csv").read_text().splitlines()[0]
    assert header.split(",") == columns


def test_documented_request_columns_exist() -> None:
    table = README[README.index("| column | definition |") :]
    table = table[: table.index("\n\n")]
    names = {n for line in table.splitlines()[2:] for n in _names(line.split("|")[1])}
    assert names and names <= set(REQUEST_SCHEMA), names - set(REQUEST_SCHEMA)


def test_the_correctness_counts_named_in_the_readme_are_summary_columns() -> None:
    text = _paragraph("`summary.csv` rows and the trend store carry the same counts")
    counts = {"divergences", "pool_divergences", "cache_failures", "on_only", "off_inconsistent"}
    assert counts <= set(_names(text))
    assert counts <= set(report.SUMMARY_COLUMNS)


def _command_table() -> list[tuple[str, str]]:
    """The README's command table: (command cell, what-it-does cell) per row."""
    table = README[README.index("| command | what it does |") :]
    table = table[: table.index("\n\n")]
    cells = [re.split(r"(?<!\\)\|", line) for line in table.splitlines()[2:]]
    return [(row[1], row[2]) for row in cells]


def test_every_command_is_in_the_readmes_table_and_every_flag_there_exists() -> None:
    import click

    from sessiongen.cli import cli

    rows = [usage for usage, _what in _command_table()]
    documented = {name for row in rows for name in re.findall(r"`sessiongen ([a-z-]+)", row)}
    assert documented == set(cli.commands), documented ^ set(cli.commands)
    for row in rows:
        for usage in re.findall(r"`sessiongen ([^`]+)`", row):
            words = usage.split()
            command: click.Command = cli
            while isinstance(command, click.Group) and words and words[0] in command.commands:
                command = command.commands[words.pop(0)]
            flags = {o for p in command.params for o in p.opts}
            for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", " ".join(words)):
                assert flag in flags, f"{usage}: {flag} is not an option of {command.name}"


def test_the_notebook_command_is_documented_with_its_output() -> None:
    (what,) = [w for usage, w in _command_table() if "`sessiongen notebook RUN_DIR" in usage]
    assert "`RUN_DIR/report/analysis.html`" in what
    from sessiongen.report.notebook import DEFAULT_OUTPUT

    assert DEFAULT_OUTPUT.as_posix() == "report/analysis.html"
