"""The equivalence check on synthetic runs: planted divergences are found, noise is not.

The synthetic writer gives every (session, turn) one answer in all arms and blocks and a
first-token logprob of -0.125. Tests rewrite ``requests.parquet`` to plant what they need:
token ids that differ (``diverge`` in the spec, or a digest changed here), logprob noise
under the tolerance, a logprob shift beyond it, or one answer for every prompt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sessiongen import analysis, report
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

SPEC = SyntheticSpec(probe="equivalence", placements=("alternate",), sessions=4, turns=3)
GROUPS = 4 * 3  # sessions x turns, one placement and context


def _rewrite(run_dir: Path, **columns: pl.Expr) -> Path:
    """Replace columns of the run's non-warm-up rows, in place."""
    path = run_dir / "requests.parquet"
    frame = pl.read_parquet(path)
    warm = pl.col("warmup")
    frame = frame.with_columns(
        pl.when(warm).then(pl.col(name)).otherwise(expr).alias(name)
        for name, expr in columns.items()
    )
    frame.write_parquet(path)
    return run_dir


def _row(session: int, turn: int, block: int) -> pl.Expr:
    return (
        (pl.col("session_index") == session)
        & (pl.col("turn") == turn)
        & (pl.col("block_in_placement") == block)
    )


def _noisy(tmp_path: Path, amplitude: float) -> Path:
    """A clean equivalence run whose first-token logprobs jitter by up to ``amplitude``."""
    run_dir = write_run(tmp_path, SPEC)
    height = pl.read_parquet(run_dir / "requests.parquet").height
    jitter = np.random.default_rng(3).uniform(-amplitude / 2, amplitude / 2, height)
    return _rewrite(run_dir, first_logprob=pl.col("first_logprob") + pl.Series(jitter))


def test_noise_under_the_tolerance_is_not_a_divergence(tmp_path: Path) -> None:
    run = analysis.load_run(_noisy(tmp_path, 0.8 * analysis.LOGPROB_TOL))
    eq = analysis.equivalence(run)
    assert (eq.groups, eq.compared, eq.diverged, eq.ids_differ, eq.rate) == (
        GROUPS,
        GROUPS,
        0,
        0,
        0.0,
    )
    assert eq.max_logprob_diff is not None
    assert 0.5 * analysis.LOGPROB_TOL < eq.max_logprob_diff < analysis.LOGPROB_TOL
    assert eq.distinct_outputs == GROUPS and not eq.vacuous
    assert analysis.run_summary(run)["divergences"].sum() == 0
    text = report.write_report(run.path).read_text()
    problems = text[text.index("## Problems") : text.index("## Headline")]
    assert "None found" in problems
    assert f"identical across cache arms and blocks in all {GROUPS} (session, turn)" in problems


def test_planted_token_divergence_is_found_with_its_rate_and_worst_case(tmp_path: Path) -> None:
    run = analysis.load_run(write_run(tmp_path, with_changes(SPEC, turns=4, diverge=2)))
    table = analysis.divergences(run).filter(pl.col("diverged"))
    assert table.select("session_id", "turn", "ids_differ", "arms_differ").rows() == [
        ("32k-002", 4, True, True),
        ("32k-003", 4, True, True),
    ]
    eq = analysis.equivalence(run)
    assert (eq.compared, eq.ids_differ, eq.arms_differ) == (16, 2, 2)
    assert eq.rate == pytest.approx(2 / 16)
    assert eq.max_logprob_diff == pytest.approx(2.5 - 0.125)
    assert eq.worst is not None and eq.worst["turn"] == 4 and eq.worst["n_digests"] == 2
    assert eq.worst_rows.height == 4  # one row per block
    assert eq.worst_rows["output_digest"].n_unique() == 2
    summary = analysis.run_summary(run).filter(pl.col("turn") == 4)
    assert summary["divergences"].to_list() == [2, 2]  # on the OFF and the ON row


def test_a_logprob_shift_beyond_the_tolerance_fails_with_the_same_tokens(tmp_path: Path) -> None:
    shift = 10 * analysis.LOGPROB_TOL
    run_dir = _rewrite(
        write_run(tmp_path, SPEC),
        first_logprob=pl.when(_row(1, 2, 1))
        .then(pl.col("first_logprob") + shift)
        .otherwise(pl.col("first_logprob")),
    )
    run = analysis.load_run(run_dir)
    eq = analysis.equivalence(run)
    assert (eq.diverged, eq.ids_differ, eq.logprob_beyond_tol, eq.rate) == (1, 0, 1, 0.0)
    assert eq.max_logprob_diff == pytest.approx(shift)
    assert eq.worst is not None and (eq.worst["session_id"], eq.worst["turn"]) == ("32k-001", 2)
    assert analysis.run_summary(run)["divergences"].sum() == 2
    assert analysis.equivalence(run, logprob_tol=2 * shift).diverged == 0


def test_blocks_of_one_arm_are_compared_too(tmp_path: Path) -> None:
    # The second ON block and the last OFF block agree with each other but not with the
    # first two blocks: both arms hold the same two answers, yet the run is not stable.
    odd = _row(0, 3, 2) | _row(0, 3, 3)
    run_dir = _rewrite(
        write_run(tmp_path, SPEC),
        output_digest=pl.when(odd).then(pl.lit("0dd0dd0dd0dd0dd0")).otherwise("output_digest"),
    )
    run = analysis.load_run(run_dir)
    row = analysis.divergences(run).filter(pl.col("diverged")).row(0, named=True)
    assert (row["session_id"], row["turn"], row["arms_differ"], row["ids_differ"]) == (
        "32k-000",
        3,
        False,
        True,
    )
    assert analysis.equivalence(run).rate == pytest.approx(1 / GROUPS)


def test_rows_without_logprobs_or_digests_are_left_out(tmp_path: Path) -> None:
    run_dir = _rewrite(
        write_run(tmp_path, SPEC),
        first_logprob=pl.lit(None, dtype=pl.Float64),
        output_digest=pl.when(pl.col("block_in_placement") == 0)
        .then(pl.lit(None, dtype=pl.String))
        .otherwise(pl.col("output_digest")),
    )
    eq = analysis.equivalence(analysis.load_run(run_dir))
    assert (eq.compared, eq.diverged, eq.max_logprob_diff) == (GROUPS, 0, None)
    assert eq.worst_rows.height == 3  # the blocks with a digest


def test_one_answer_for_every_prompt_is_reported_as_vacuous(tmp_path: Path) -> None:
    run_dir = _rewrite(write_run(tmp_path, SPEC), output_digest=pl.lit("5a5e5a5e5a5e5a5e"))
    run = analysis.load_run(run_dir)
    eq = analysis.equivalence(run)
    assert eq.vacuous and eq.diverged == 0
    text = report.write_report(run_dir).read_text()
    assert text.index("Equivalence probe is vacuous") < text.index("## Headline")
    assert "None found" not in text


def test_report_shows_the_divergence_first(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, with_changes(SPEC, turns=4, diverge=1, needle_wrong=0))
    text = report.write_report(run_dir).read_text()
    order = [
        text.index("## Problems"),
        text.index("**Correctness: answers diverged in 1 of 16 (session, turn)"),
        text.index("divergence rate 6.2%"),
        text.index("Largest first-token logprob difference: 2.38"),
        text.index(
            "**Worst case: alternate, context 32768, session 32k-003, turn 4: 2 different answers"
        ),
        text.index("## Headline"),
    ]
    assert order == sorted(order)
    assert "None found" not in text
    html = (run_dir / "report" / "report.html").read_text()
    assert html.index("answers diverged") < html.index("Headline")
