"""What a run's report shows, computed once (:class:`Frames`), and how a section shows a frame."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.frames import drop_single_context
from sessiongen.analysis.stats import Bootstrap
from sessiongen.analysis.verdicts import Correctness, Equivalence
from sessiongen.records.run import Run
from sessiongen.report.document import (
    Table,
)

TOKEN_MEANS = ("prompt_tokens", "cached_tokens", "local_hit_tokens", "external_hit_tokens")


@dataclass(frozen=True)
class Frames:
    """Everything the report shows, computed once."""

    arm: pl.DataFrame
    speedup: pl.DataFrame
    summary: pl.DataFrame
    cross: pl.DataFrame
    cold: pl.DataFrame
    sessions: pl.DataFrame
    drift: pl.DataFrame
    attribution: pl.DataFrame
    contamination: pl.DataFrame
    needles: pl.DataFrame
    divergences: pl.DataFrame
    correctness: Correctness
    error: pl.DataFrame
    cold_check: pl.DataFrame
    lag: pl.DataFrame

    @property
    def equivalence(self) -> Equivalence:
        return self.correctness.equivalence

    @classmethod
    def compute(
        cls, run: Run, boot: Bootstrap, logprob_tol: float = analysis.LOGPROB_TOL
    ) -> Frames:
        speedup = analysis.speedup_table(run, boot=boot)
        return cls(
            arm=analysis.arm_turn_table(run, boot=boot),
            speedup=speedup,
            summary=analysis.run_summary(run, boot=boot, logprob_tol=logprob_tol),
            cross=analysis.cross_vs_same(run, boot=boot),
            cold=analysis.cold_first_turns(run, boot=boot),
            sessions=analysis.session_speedup(run, boot=boot),
            drift=analysis.block_drift(run, boot=boot, speedups=speedup),
            attribution=analysis.cache_attribution(run),
            contamination=analysis.contamination(run),
            needles=analysis.needle_grades(run),
            divergences=analysis.divergences(run, logprob_tol=logprob_tol),
            correctness=analysis.correctness(run, logprob_tol=logprob_tol),
            error=analysis.measurement_error(run),
            cold_check=analysis.cold_turn_asymmetry(run, boot=boot),
            lag=analysis.lag_effect(run),
        )


def show(frame: pl.DataFrame, *columns: str) -> Table:
    """A display table: the chosen columns, context_tokens dropped when single-valued."""
    present = [c for c in columns if c in frame.columns]
    return Table(drop_single_context(frame.select(present)))


def drift_table(drift: pl.DataFrame) -> Table:
    return show(
        drift,
        "placement",
        "cache",
        "context_tokens",
        "turn",
        "n_units",
        "drift",
        "effect",
        "arm_drift",
        "arm_drift_ci_low",
        "arm_drift_ci_high",
        "status",
    )
