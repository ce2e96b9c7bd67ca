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
