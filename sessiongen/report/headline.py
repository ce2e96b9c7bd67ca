"""The report's answer: the decision's rows as ``decision.csv`` and the headline per-turn
speedup curve, with the later turns where the pool surely costs more than recomputing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from sessiongen import analysis
from sessiongen.analysis import stats
from sessiongen.analysis.stats import MIN_SESSIONS, Bootstrap
from sessiongen.infra.lazy import lazy_module
from sessiongen.records.run import Run
from sessiongen.report.decision import Decision
from sessiongen.report.document import (
    Element,
    Heading,
    Image,
    Paragraph,
)
from sessiongen.report.frames import Frames, show

if TYPE_CHECKING:
    from scipy import stats as sps
else:
    sps = lazy_module("scipy.stats")

HEADLINE = "Headline: shared-cache speedup per turn"


def headline_section(
    run: Run, f: Frames, figures: dict[str, Path], boot: Bootstrap
) -> list[Element]:
    fewest = analysis.fewest_sessions(run)
    coverage = analysis.coverage_note(fewest) if fewest is not None else None
    return [
        Heading(HEADLINE),
        Paragraph(
            "Speedup = median TTFT with the cache off / median TTFT with it on, per placement "
            f"and turn; {boot.method()}; 'paired' means sessions were resampled as units "
            "in both arms at once."
        ),
        Image(figures["speedup"], "speedup per turn, one line per placement, with CI bands"),
        show(
            f.speedup,
            "placement",
            "context_tokens",
            "turn",
            "median_off_s",
            "median_on_s",
            "speedup",
            "speedup_ci_low",
            "speedup_ci_high",
            "paired",
            "n_off",
            "n_on",
        ),
        *_pool_overhead(f),
        *([Paragraph(coverage)] if coverage and fewest and fewest >= MIN_SESSIONS else []),
    ]


def _pool_overhead(f: Frames) -> list[Element]:
    """Later turns the pool served where it surely costs more than recomputing.

    One-sided tests of "speedup < 1" from each cell's standard error (normal on the log
    scale), Holm-corrected over the later turns with pool hits: a run has many cells, and
    one in twenty would look slower by chance.
    """
    hits = f.attribution.filter(pl.col("cache") == "on").select(
        "placement", "context_tokens", "turn", "external_hit_tokens", "prompt_tokens"
    )
    cells = f.speedup.filter(pl.col("turn") > 1).join(
        hits, on=["placement", "context_tokens", "turn"], how="inner"
    )
    cells = cells.filter(
        pl.col("external_hit_tokens") > 0,
        pl.col("speedup_log_se") > 0,
        pl.col("speedup").is_not_null(),
    )
    if cells.is_empty():
        return []
    z = (cells["speedup"].log() / cells["speedup_log_se"]).to_numpy()
    adjusted = stats.holm(sps.norm.cdf(z))
    slower = cells.with_columns(p=pl.Series(adjusted)).filter(pl.col("p") < 0.05)
    if slower.is_empty():
        return []
    parts = [
        f"{r['placement']} context {r['context_tokens']} turn {r['turn']} "
        f"{r['speedup']:.2f}x [{r['speedup_ci_low']:.3f}, {r['speedup_ci_high']:.3f}] with "
        f"{_tokens(r['external_hit_tokens'])} of {_tokens(r['prompt_tokens'])} prompt tokens "
        "from the pool"
        for r in slower.iter_rows(named=True)
    ]
    return [
        Paragraph(
            "Pool overhead: these turns are surely slower with the shared cache on than "
            "recomputing (one-sided tests, Holm-corrected over the later turns the pool "
            "served): " + "; ".join(parts) + ". A pool hit that small costs its lookup and "
            "transfer and saves little prefill.",
            warning=True,
        )
    ]


def _tokens(value: float | None) -> str:
    return "no" if value is None else f"{value:,.0f}"


#: The decision's rows as data: what-if column names (``WHATIF_COLUMNS``), one row per cell.
DECISION_FILE = "decision.csv"


DECISION_COLUMNS = (
    "placement",
    "context_tokens",
    "load_level",
    "session_gain",
    "session_gain_low",
    "session_gain_high",
    "sessions",
    "later_gain",
    "later_gain_low",
    "later_gain_high",
    "later_turn_gain",
    "stable_off",
    "stable_on",
    "pays_at",
    "verdict",
)


def decision_frame(d: Decision) -> pl.DataFrame:
    """``decision.csv``: the decision's rows under their what-if names."""
    return d.rows.select(c for c in DECISION_COLUMNS if c in d.rows.columns)
