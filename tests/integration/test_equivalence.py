"""The equivalence check on synthetic runs: counted against OFF, on identical prompts only.

The synthetic writer gives every prompt (block salt, session, turn) one answer in all
arms and blocks and a first-token logprob of -0.125; ON requests on cross-replica turns
of ``alternate`` carry external hits (the shared pool served them). Tests rewrite
``requests.parquet`` to plant what they need: token ids that differ (``diverge``, or a
digest changed here), logprob noise under the tolerance, a shift beyond it, OFF answers
that disagree, one answer for every prompt, every block with its own salt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sessiongen import analysis, report
from sessiongen.analysis.correctness import (
    CACHE_FAILURE,
    DIVERGED,
    NOT_EXERCISED,
    OFF_INCONSISTENT,
    PASSED,
    VACUOUS,
    WITHIN_NOISE,
)
from sessiongen.analysis.prompts import BASIS_SESSION
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

SPEC = SyntheticSpec(probe="equivalence", placements=("alternate",), sessions=4, turns=3)
PROMPTS = 4 * 3  # sessions x turns, one placement and context
ON_ROWS = 2 * PROMPTS  # two ON blocks
POOL_SERVED = 2 * 4 * 2  # ON blocks x sessions x cross-replica turns (2 and 3)


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


def _problems(run_dir: Path) -> str:
    text = report.write_report(run_dir).read_text()
    return text[text.index("## Problems") : text.index("## Headline")]


def _noisy(tmp_path: Path, amplitude: float) -> Path:
    """A clean equivalence run whose first-token logprobs jitter by up to ``amplitude``."""
    run_dir = write_run(tmp_path, SPEC)
    height = pl.read_parquet(run_dir / "requests.parquet").height
    jitter = np.random.default_rng(3).uniform(-amplitude / 2, amplitude / 2, height)
    return _rewrite(run_dir, first_logprob=pl.col("first_logprob") + pl.Series(jitter))


def test_noise_under_the_tolerance_passes(tmp_path: Path) -> None:
    run = analysis.load_run(_noisy(tmp_path, 0.8 * analysis.LOGPROB_TOL))
    eq = analysis.equivalence(run)
    assert (eq.prompts, eq.compared, eq.failures, eq.ids_differ, eq.rate) == (
        PROMPTS,
        ON_ROWS,
        0,
        0,
        0.0,
    )
    assert (eq.exercised, eq.evidence, eq.verdict) == (POOL_SERVED, "request", PASSED)
    assert eq.max_logprob_diff is not None
    assert 0.3 * analysis.LOGPROB_TOL < eq.max_logprob_diff < analysis.LOGPROB_TOL
    assert eq.distinct_outputs == PROMPTS and not eq.vacuous
    summary = analysis.run_summary(run)
    assert summary.select(pl.sum("divergences", "cache_failures", "off_inconsistent")).row(0) == (
        0,
        0,
        0,
    )
    problems = _problems(run.path)
    assert "None found" in problems
    assert f"Equivalence passed: all {ON_ROWS} ON answers compared" in problems
    assert f"{POOL_SERVED} of {ON_ROWS} compared were served from the shared pool" in problems


def test_planted_token_divergence_is_a_cache_failure_with_its_rate(tmp_path: Path) -> None:
    # Every session's turn 4 differs in the first ON block: 4 of 24 pool-served answers
    # against 0 of 24 comparisons where the pool had no part (turn 1 ON, OFF vs OFF).
    run = analysis.load_run(write_run(tmp_path, with_changes(SPEC, turns=4, diverge=4)))
    table = analysis.divergences(run).filter(pl.col("diverged"))
    assert table.select("session_id", "turn", "block", "ids_differ", "verdict").rows() == [
        (f"32k-00{s}", 4, 1, True, DIVERGED) for s in range(4)
    ]
    eq = analysis.equivalence(run)
    assert (eq.compared, eq.ids_differ, eq.failures, eq.verdict) == (32, 4, 4, CACHE_FAILURE)
    b = eq.baseline
    assert (b.pool_compared, b.pool_diverged, b.base_compared, b.base_diverged) == (24, 4, 24, 0)
    assert b.p_value == pytest.approx(0.0298, abs=1e-3) and b.significant
    assert eq.rate == pytest.approx(4 / 32)
    assert eq.max_logprob_diff == pytest.approx(2.5 - 0.125)
    assert eq.worst is not None and eq.worst.turn == 4 and eq.worst.ids_differ
    assert eq.worst_rows.height == 4  # every block sent the prompt
    assert eq.worst_rows["output_digest"].n_unique() == 2
    summary = analysis.run_summary(run).filter(pl.col("turn") == 4).sort("cache")
    assert summary["cache_failures"].to_list() == [0, 4]  # on the ON row only
    assert summary["divergences"].to_list() == [0, 4]
    line = analysis.correctness(run).failure_line()
    assert line is not None and "4 of 24 pool-served answers differ from OFF" in line


def test_a_few_divergences_within_the_noise_are_reported_not_failed(tmp_path: Path) -> None:
    # One divergence among the ON answers was a cache failure with exit 1 whatever the
    # noise. Two of 24 pool-served against a clean 24 is p = 0.16: within noise.
    run = analysis.load_run(write_run(tmp_path, with_changes(SPEC, turns=4, diverge=2)))
    c = analysis.correctness(run)
    eq = c.equivalence
    assert (eq.divergent, eq.failures, eq.verdict) == (2, 0, WITHIN_NOISE)
    assert c.cache_failures == 0 and c.failure_line() is None
    summary = analysis.run_summary(run)
    assert summary["cache_failures"].sum() == 0 and summary["pool_divergences"].sum() == 2
    problems = _problems(run.path)
    assert "Equivalence within noise: pool-served answers differ from OFF" in problems
    assert "2 of 24 pool-served answers differ from OFF, against 0 of 24" in problems


def test_divergences_the_pool_did_not_serve_are_noise_not_failures(tmp_path: Path) -> None:
    # Cold first turns answered differently in an ON block (the arms run different code):
    # not the pool's doing, however many.
    run_dir = _rewrite(
        write_run(tmp_path, SPEC),
        output_digest=pl.when((pl.col("turn") == 1) & (pl.col("cache") == "on"))
        .then(pl.lit("c01dc01dc01dc01d"))
        .otherwise(pl.col("output_digest")),
    )
    eq = analysis.equivalence(analysis.load_run(run_dir))
    assert eq.divergent == 8 and eq.baseline.base_diverged == 8
    assert (eq.failures, eq.verdict) == (0, PASSED)


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
    assert (eq.divergent, eq.ids_differ, eq.logprob_beyond_tol, eq.rate) == (1, 0, 1, 0.0)
    assert (eq.failures, eq.verdict) == (0, WITHIN_NOISE)  # one of 16 is within the noise
    assert eq.max_logprob_diff == pytest.approx(shift)
    assert eq.worst is not None and (eq.worst.session_id, eq.worst.turn) == ("32k-001", 2)
    # The same shift on every session's turn 2 in one ON block: 4 of 16 against 0 of 20.
    shifted = _rewrite(
        write_run(tmp_path / "all", SPEC),
        first_logprob=pl.when((pl.col("turn") == 2) & (pl.col("block_in_placement") == 1))
        .then(pl.col("first_logprob") + shift)
        .otherwise(pl.col("first_logprob")),
    )
    run = analysis.load_run(shifted)
    eq = analysis.equivalence(run)
    assert (eq.failures, eq.ids_differ, eq.logprob_beyond_tol) == (4, 0, 4)
    assert analysis.run_summary(run)["cache_failures"].sum() == 4
    assert analysis.equivalence(run, logprob_tol=2 * shift).failures == 0


def test_off_answers_that_disagree_are_the_models_limit_not_the_caches(tmp_path: Path) -> None:
    # The last OFF block answers one prompt differently: ON cannot be judged there.
    run = analysis.load_run(write_run(tmp_path, with_changes(SPEC, turns=4, off_diverge=1)))
    eq = analysis.equivalence(run)
    assert (eq.failures, eq.off_inconsistent, eq.verdict) == (0, 1, OFF_INCONSISTENT)
    assert eq.compared == 32 - 2  # the two ON answers to that prompt are not judged
    judged = analysis.divergences(run).filter(pl.col("verdict") == OFF_INCONSISTENT)
    assert judged.select("session_id", "turn").unique().rows() == [("32k-000", 4)]
    summary = analysis.run_summary(run).filter(pl.col("turn") == 4).sort("cache")
    assert summary["off_inconsistent"].to_list() == [1, 0]
    assert summary["cache_failures"].sum() == 0
    assert analysis.correctness(run).failure_line() is None
    problems = _problems(run.path)
    assert "Equivalence, OFF inconsistent: the OFF answers to 1 prompts disagree" in problems
    assert "cache failure" not in problems


def test_on_answers_with_no_off_answer_are_reported_apart(tmp_path: Path) -> None:
    # Two ON blocks of the same prompts disagree once: no OFF answer says which is right.
    spec = with_changes(SPEC, blocks=("on", "on"))
    run_dir = _rewrite(
        write_run(tmp_path, spec),
        output_digest=pl.when(_row(2, 3, 1))
        .then(pl.lit("0n0n0n0n0n0n0n0n"))
        .otherwise(pl.col("output_digest")),
    )
    run = analysis.load_run(run_dir)
    eq = analysis.equivalence(run)
    assert (eq.failures, eq.on_only, eq.compared, eq.verdict) == (0, 1, 0, NOT_EXERCISED)
    assert eq.no_reference == ON_ROWS
    assert analysis.run_summary(run)["on_only"].sum() == 1
    problems = _problems(run_dir)
    assert "Equivalence, ON only: the ON answers to 1 prompts disagree" in problems
    assert "Equivalence not exercised: the run has no OFF arm" in problems


@pytest.mark.parametrize("blocks", [("on", "on"), ("off", "on"), ("off", "on", "on", "off")])
def test_blocks_with_their_own_salts_never_diverge(tmp_path: Path, blocks: tuple[str, ...]) -> None:
    # Endpoints cannot restart: every block has its own salt, so no prompt repeats across
    # blocks and the same session id names different prompts. Nothing may be compared.
    spec = with_changes(SPEC, blocks=blocks, block_salts=True)
    run = analysis.load_run(write_run(tmp_path, spec))
    eq = analysis.equivalence(run)
    assert (eq.compared, eq.failures, eq.on_only, eq.off_inconsistent) == (0, 0, 0, 0)
    assert eq.prompts == len(blocks) * PROMPTS and eq.verdict == NOT_EXERCISED
    assert analysis.run_summary(run)["cache_failures"].sum() == 0
    assert analysis.correctness(run).failure_line() is None
    problems = _problems(run.path)
    assert "answers diverged" not in problems and "Equivalence not exercised" in problems
    if "off" in blocks:
        assert "no prompt was sent in both arms" in problems


def test_without_pool_hits_a_clean_run_is_not_exercised(tmp_path: Path) -> None:
    run_dir = _rewrite(write_run(tmp_path, SPEC), external_hit_tokens=pl.lit(0, pl.Int64))
    eq = analysis.equivalence(analysis.load_run(run_dir))
    assert (eq.compared, eq.exercised, eq.failures, eq.verdict) == (ON_ROWS, 0, 0, NOT_EXERCISED)
    problems = _problems(run_dir)
    assert f"none of the {ON_ROWS} ON requests compared with OFF was served" in problems
    assert "Equivalence passed" not in problems


def test_rows_without_logprobs_or_digests_are_left_out(tmp_path: Path) -> None:
    run_dir = _rewrite(
        write_run(tmp_path, SPEC),
        first_logprob=pl.lit(None, dtype=pl.Float64),
        output_digest=pl.when(pl.col("block_in_placement") == 0)
        .then(pl.lit(None, dtype=pl.String))
        .otherwise(pl.col("output_digest")),
    )
    eq = analysis.equivalence(analysis.load_run(run_dir))
    assert (eq.compared, eq.failures, eq.max_logprob_diff) == (ON_ROWS, 0, None)
    assert eq.worst_rows.height == 3  # the blocks with a digest


def test_one_answer_for_every_prompt_is_reported_as_vacuous(tmp_path: Path) -> None:
    run_dir = _rewrite(write_run(tmp_path, SPEC), output_digest=pl.lit("5a5e5a5e5a5e5a5e"))
    run = analysis.load_run(run_dir)
    eq = analysis.equivalence(run)
    assert eq.vacuous and eq.failures == 0 and eq.verdict == VACUOUS
    text = report.write_report(run_dir).read_text()
    assert text.index("Equivalence probe is vacuous") < text.index("## Headline")
    assert "None found" not in text


def test_report_shows_the_cache_failure_first(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, with_changes(SPEC, turns=4, diverge=4, needle_wrong=0))
    text = report.write_report(run_dir).read_text()
    order = [
        text.index("## Problems"),
        text.index("**Correctness (cache failure): the pool-served answers differ from OFF"),
        text.index("divergence rate 12.5%"),
        text.index("Largest first-token logprob difference from OFF: 2.38"),
        text.index(
            "**Worst case: alternate, context 32768, session 32k-000, turn 4, block 1: answer "
            "ffffffffffffffff where OFF answered"
        ),
        text.index("## Headline"),
    ]
    assert order == sorted(order)
    assert "None found" not in text
    html = (run_dir / "report" / "report.html").read_text()
    assert html.index("cache failure") < html.index("Headline")


def test_schema_1_runs_fall_back_to_block_salt_session_and_turn(tmp_path: Path) -> None:
    old = with_changes(SPEC, turns=4, diverge=1, schema_version=1)
    run_dir = write_run(tmp_path / "a", old)
    eq = analysis.equivalence(analysis.load_run(run_dir))
    assert (eq.basis, eq.compared, eq.divergent) == (BASIS_SESSION, 32, 1)
    assert "Prompts were matched by block salt, session and turn" in _problems(run_dir)
    # Old runs whose blocks had their own salts: the same session is not the same prompt.
    salted = with_changes(old, block_salts=True)
    eq = analysis.equivalence(analysis.load_run(write_run(tmp_path / "b", salted)))
    assert (eq.compared, eq.failures, eq.verdict) == (0, 0, NOT_EXERCISED)
