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


def test_a_measurement_error_that_moves_no_verdict_is_a_note_and_one_that_can_a_problem(
    tmp_path: Path,
) -> None:
    import dataclasses

    import polars as pl

    from sessiongen.report.problems import error_moves_verdict, problems_section

    run = load_run(write_run(tmp_path, SyntheticSpec(sessions=6, turns=2))).levels_apart()
    frames = Frames.compute(run, DEFAULT_BOOTSTRAP)
    error = pl.DataFrame(  # one cell of the alternate arm 2.1% late, the quick start's
        {"placement": ["alternate", "alternate"], "cache": ["off", "on"], "turn": [2, 2],
         "error_share": [0.004, 0.021], "flagged": [False, True]}
    )  # fmt: skip
    frames = dataclasses.replace(frames, error=error)

    def rows(low: float, high: float) -> pl.DataFrame:
        return pl.DataFrame(
            {"placement": ["alternate"], "session_gain_low": [low],
             "session_gain_high": [high], "pays_at": [1.1]}
        )  # fmt: skip

    far, near = rows(1.82, 1.82), rows(1.11, 1.30)  # 1.11 / (1.021 / 0.979) < 1.1
    assert not error_moves_verdict(error, far) and error_moves_verdict(error, near)
    assert error_moves_verdict(error, None)  # no verdicts to read: it stays a problem
    assert not error_moves_verdict(error, rows(0.5, 1.05).with_columns(placement=pl.lit("fixed")))

    def where(blocks: list[Element]) -> tuple[bool, bool]:
        """(under Problems as a warning, under Notes as a note)."""
        section, found = "", (False, False)
        for b in blocks:
            if isinstance(b, Heading):
                section = b.text
            elif isinstance(b, Paragraph) and b.text.startswith("Measurement error above"):
                found = (section == "Problems" and b.warning, section == "Notes" and not b.warning)
        return found

    assert where(problems_section(run, frames, far)) == (False, True)
    assert where(problems_section(run, frames, near)) == (True, False)
