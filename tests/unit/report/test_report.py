"""The report folder: files exist, numbers match a recomputation, images are valid."""

from __future__ import annotations

import base64
import csv
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from sessiongen import report
from sessiongen.records.run import load_run
from sessiongen.report.plots import FIGURE_NAMES
from sessiongen.report.reusesection import HEADING, reuse_section
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

FAULTY = SyntheticSpec(contaminate=True, probe="needle", needle_wrong=5, failing_sessions=1)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def faulty_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("runs"), FAULTY)
    return report.write_report(run_dir)


@pytest.fixture(scope="module")
def clean_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return report.write_report(write_run(tmp_path_factory.mktemp("runs"), SyntheticSpec()))


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_report_files_exist(faulty_report: Path) -> None:
    out = faulty_report.parent
    assert faulty_report == out / "report.md" and out.name == "report"
    for name in ("report.md", "report.html", "summary.csv"):
        assert (out / name).stat().st_size > 500, name
    for name in FIGURE_NAMES:
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000, name
        svg = (out / f"{name}.svg").read_text()
        assert svg.startswith("<?xml") and "<svg" in svg and len(svg) > 5_000, name


def test_summary_csv_matches_requests_parquet(faulty_report: Path) -> None:
    run_dir = faulty_report.parent.parent
    rows = _csv(run_dir / "report" / "summary.csv")
    assert list(rows[0]) == list(report.SUMMARY_COLUMNS)
    # Recompute from the raw records, independently of sessiongen.analysis.latency.
    raw = pl.read_parquet(run_dir / "requests.parquet")
    ok = raw.filter(~pl.col("warmup"), pl.col("status") == "ok")
    med = ok.group_by("placement", "cache", "turn").agg(
        n=pl.len(), median=(pl.col("ttft_s") / FAULTY.time_scale).median()
    )
    expect = {(r["placement"], r["cache"], r["turn"]): r for r in med.iter_rows(named=True)}
    assert len(rows) == len(expect) == 24
    for row in rows:
        key = (row["placement"], row["cache"], int(row["turn"]))
        assert int(row["n"]) == expect[key]["n"]
        assert float(row["median_ttft_s"]) == pytest.approx(expect[key]["median"], rel=1e-9)
        assert float(row["ci_low_s"]) <= float(row["median_ttft_s"]) <= float(row["ci_high_s"])
        if row["cache"] == "off":
            assert row["speedup"] == row["speedup_ci_low"] == ""
        else:
            off = expect[(key[0], "off", key[2])]["median"]
            assert float(row["speedup"]) == pytest.approx(off / expect[key]["median"], rel=1e-9)
            assert float(row["speedup_ci_low"]) <= float(row["speedup"])


def test_problems_come_first(faulty_report: Path, clean_report: Path) -> None:
    text = faulty_report.read_text()
    order = [
        text.index("## Problems"),
        text.index("Correctness (cache failure): 5 pool-served needle answers wrong in the ON"),
        text.index("answered the same prompt right, more often than the noise allows"),
        text.index("Contamination: 3 requests"),
        text.index("Request errors: 1."),
        text.index("## Headline"),
    ]
    assert order == sorted(order)
    assert "modeled seconds" in text and "SIMULATED" in text
    assert "None found" not in text
    clean = clean_report.read_text()
    assert clean.index("None found") < clean.index("## Headline")
    assert "Client overhead (calibration)" in clean


def test_cautions_of_a_run_without_report_are_the_reports_own(
    faulty_report: Path, tmp_path: Path
) -> None:
    """What the notebook shows (report.run_cautions) for a run with no report yet is what
    its report then writes to cautions.json; with one, it is read from there."""
    run_dir = faulty_report.parent.parent
    bare = tmp_path / run_dir.name
    shutil.copytree(run_dir, bare, ignore=shutil.ignore_patterns("report"))
    written = report.read_cautions(faulty_report.parent)
    assert written is not None and written["problems"] and written["limits"] == []
    assert report.run_cautions(bare) == written
    assert not (bare / "report").exists()  # computed, nothing written
    assert report.run_cautions(run_dir) == written


def test_html_is_self_contained(faulty_report: Path) -> None:
    html = (faulty_report.parent / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == len(FIGURE_NAMES)
    assert all(base64.b64decode(img).startswith(PNG_MAGIC) for img in images)
    assert not re.search(r'src="(?!data:)', html)
    assert html.index("Problems") < html.index("Headline")


def test_markdown_links_the_pngs(faulty_report: Path) -> None:
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", faulty_report.read_text())
    assert sorted(links) == sorted(f"{name}.png" for name in FIGURE_NAMES)


def test_report_is_reproducible(clean_report: Path) -> None:
    out = clean_report.parent
    before = {n: (out / n).read_bytes() for n in ("report.md", "summary.csv")}
    report.write_report(out.parent)
    assert {n: (out / n).read_bytes() for n in before} == before


def test_context_sizes_and_single_arm_runs(tmp_path: Path) -> None:
    spec = with_changes(SyntheticSpec(), contexts=(8192, 32768), placements=("alternate",))
    multi = report.write_report(write_run(tmp_path / "multi", spec))
    header = _csv(multi.parent / "summary.csv")[0]
    assert list(header)[:4] == ["placement", "cache", "context_tokens", "turn"]
    only_on = with_changes(SyntheticSpec(), blocks=("on", "on"), placements=("fixed",))
    single = report.write_report(write_run(tmp_path / "single", only_on))
    rows = _csv(single.parent / "summary.csv")
    assert {r["cache"] for r in rows} == {"on"} and all(r["speedup"] == "" for r in rows)
    assert (single.parent / "speedup.png").read_bytes().startswith(PNG_MAGIC)


def _lagged(tmp_path: Path, slower: float) -> str:
    """A clean run whose turn-2 requests in the first OFF and ON blocks are lag-flagged
    and ``slower`` (the other block of each arm is not)."""
    spec = SyntheticSpec(placements=("alternate",), turns=3, noise_sigma=0.005)
    run_dir = write_run(tmp_path, spec)
    path = run_dir / "requests.parquet"
    frame = pl.read_parquet(path)
    first = pl.col("block_in_placement").is_in([0, 1])
    hit = (pl.col("turn") == 2) & first & ~pl.col("warmup")
    frame = frame.with_columns(
        loop_lag_flag=pl.when(hit).then(True).otherwise(pl.col("loop_lag_flag")),
        ttft_s=pl.when(hit).then(pl.col("ttft_s") * slower).otherwise(pl.col("ttft_s")),
    )
    frame.write_parquet(path)
    return report.write_report(run_dir).read_text()


def _section(text: str, heading: str) -> str:
    """The report's section under ``## heading``, up to the next one ('' when absent)."""
    if f"\n## {heading}\n" not in text:
        return ""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_lag_that_moved_no_figure_is_a_note_not_a_problem(tmp_path: Path) -> None:
    # Every simulated run's Problems opened with "N requests saw client event-loop lag
    # that could have moved their TTFT": the possibility, not the evidence. Then the
    # quick start's Problems still carried the note on a busy machine.
    text = _lagged(tmp_path, slower=1.0)
    problems, notes = _section(text, "Problems"), _section(text, "Notes")
    assert "None found" in problems
    assert "lag" not in problems.lower()
    assert "Event-loop lag: 16 requests were lag-flagged" in notes  # 8 sessions x 2 arms
    assert "No figure here rests on them" in notes
    assert "moved the median TTFT" not in text
    assert text.index("## Problems") < text.index("## Notes") < text.index("## Headline")


def test_lag_that_moved_a_median_is_a_problem(tmp_path: Path) -> None:
    text = _lagged(tmp_path, slower=3.0)
    problems = _section(text, "Problems")
    assert "Client event-loop lag moved the median TTFT of 2 cells" in problems
    assert "None found" not in problems
    assert "Event-loop lag" not in _section(text, "Notes")


def test_a_run_without_lag_has_no_lag_note(clean_report: Path) -> None:
    assert "lag" not in _section(clean_report.read_text(), "Notes").lower()


def test_checks_that_passed_are_notes_not_problems(tmp_path: Path) -> None:
    # The quick start's Problems carried "Needles passed: ..." and the prompt-matching
    # basis under a clean "None found": they say what was checked.
    text = report.write_report(write_run(tmp_path, SyntheticSpec(probe="needle"))).read_text()
    problems, notes = _section(text, "Problems"), _section(text, "Notes")
    assert "None found" in problems
    assert "passed" not in problems.replace("None found", "")
    assert "Needles passed: all" in notes


def test_a_pool_slower_than_recomputing_is_reported_as_its_overhead(tmp_path: Path) -> None:
    # alt32k alternate turn 3 was 0.96x [0.962, 0.966] with 96 pool tokens, uncommented.
    spec = SyntheticSpec(
        placements=("alternate",), turns=3, noise_sigma=0.01, speedup={"alternate": 0.9}
    )
    text = report.write_report(write_run(tmp_path, spec)).read_text()
    headline = text[text.index("## Headline") :]
    assert "Pool overhead: these turns are surely slower" in headline
    assert "alternate context 32768 turn 2 0.90x" in headline
    assert "prompt tokens from the pool" in headline
    clean = report.write_report(write_run(tmp_path / "c", with_changes(spec, speedup={})))
    assert "Pool overhead" not in clean.read_text()


def test_the_headline_says_when_its_95_percent_over_covers(clean_report: Path) -> None:
    headline = clean_report.read_text().split("## Headline", 1)[1].split("\n## ", 1)[0]
    assert "At 8 sessions these 95% intervals covered" in headline
    assert "they are conservative" in headline


def test_only_a_trace_run_has_the_reuse_section(clean_report: Path) -> None:
    assert HEADING not in clean_report.read_text()
    assert not (clean_report.parent / "reuse.png").exists()
    assert reuse_section(load_run(clean_report.parent.parent), clean_report.parent, "") == []
