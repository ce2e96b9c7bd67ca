"""The report's sections come in the order build_blocks lists them, whatever their
headings say (a load run's and a trace's sections are handed in, not spliced in)."""

from __future__ import annotations

from pathlib import Path

from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP
from sessiongen.records.run import load_run
from sessiongen.report.document import Element, Heading, Paragraph
from sessiongen.report.plots import FIGURE_NAMES
from sessiongen.report.write import HEADLINE, Frames, build_blocks
from tests.support.synthetic import SyntheticSpec, write_run


def headings(blocks: list[Element]) -> list[str]:
    return [b.text for b in blocks if isinstance(b, Heading)]


def test_load_and_reuse_sections_sit_between_the_problems_and_the_headline(
    tmp_path: Path,
) -> None:
    run = load_run(write_run(tmp_path, SyntheticSpec(sessions=6, turns=2))).levels_apart()
    frames = Frames.compute(run, DEFAULT_BOOTSTRAP)
    figures = {name: Path(f"{name}.png") for name in FIGURE_NAMES}
    plain = headings(build_blocks(run, frames, figures, DEFAULT_BOOTSTRAP))
    blocks = build_blocks(
        run,
        frames,
        figures,
        DEFAULT_BOOTSTRAP,
        decision=[Heading("Decided"), Paragraph("d")],
        load=[Heading("Loaded"), Paragraph("l")],
        reuse=[Heading("Reused"), Paragraph("r")],
    )
    found = headings(blocks)
    assert found[0] == plain[0] and found[1] == "Decided"  # the title, then the decision
    assert found.index("Problems") < found.index("Loaded") < found.index("Reused")
    assert found.index("Reused") + 1 == found.index(HEADLINE)
    assert [h for h in found if h not in {"Decided", "Loaded", "Reused"}] == plain
