"""The report's details: per-arm and per-turn tables and figures, and a simulated run's
measurement error.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sessiongen import analysis
from sessiongen.records.run import Run
from sessiongen.report.document import (
    Element,
    Heading,
    Image,
    Paragraph,
)
from sessiongen.report.frames import TOKEN_MEANS, Frames, drift_table, show


def details_section(f: Frames, figures: dict[str, Path]) -> list[Element]:
    cells = ("placement", "cache", "context_tokens", "turn")
    return [
        Heading("Median TTFT per arm and turn"),
        Image(figures["median_ttft"], "median TTFT per turn per arm, log axis"),
        show(
            f.arm,
            *cells,
            "n",
            "errors",
            "median_ttft_s",
            "ci_low_s",
            "ci_high_s",
            "p90_ttft_s",
            "median_e2e_s",
            "median_queue_s",
        ),
        Heading("TTFT distributions"),
        Image(figures["ttft_cdf"], "TTFT CDF per arm"),
        Heading("Cross-replica and same-replica turns (turns 2 and later)"),
        show(
            f.cross,
            "placement",
            "context_tokens",
            "cross_replica",
            "turn",
            "median_off_s",
            "median_on_s",
            "speedup",
            "speedup_ci_low",
            "speedup_ci_high",
        ),
        Heading("Cold first turns"),
        show(
            f.cold,
            "placement",
            "cache",
            "context_tokens",
            "n",
            "median_ttft_s",
            "ci_low_s",
            "ci_high_s",
            "max_cached_tokens",
            "contamination",
        ),
        Heading("Whole sessions (complete sessions, total end-to-end time)"),
        show(
            f.sessions.rename(
                {
                    "speedup": "session_gain",
                    "speedup_ci_low": "session_gain_low",
                    "speedup_ci_high": "session_gain_high",
                }
            ),
            "placement",
            "context_tokens",
            "n_off",
            "n_on",
            "median_off_s",
            "median_on_s",
            "session_gain",
            "session_gain_low",
            "session_gain_high",
        ),
        Heading("Block drift (last block / first block of each arm, per turn)"),
        drift_table(f.drift),
        Heading("Cache attribution (mean tokens per request)"),
        Image(figures["cache_attribution"], "local and external hit tokens per turn and arm"),
        show(
            f.attribution.with_columns(pl.col(TOKEN_MEANS).round(0).cast(pl.Int64)),
            *cells,
            "prompt_tokens",
            "cached_tokens",
            "local_hit_tokens",
            "external_hit_tokens",
            "hit_fraction",
            "attributed",
            "contamination",
        ),
    ]


def fidelity_section(run: Run, f: Frames) -> list[Element]:
    """The measurement-error table of a simulated run (nothing for real targets)."""
    if f.error.is_empty() or not run.simulated:
        return []
    return [
        Heading("Measurement error (simulated target)"),
        Paragraph(
            "Client TTFT minus the simulator's own modeled TTFT, per arm and turn, in "
            f"{run.seconds}: the client's and the simulator's lateness"
            f"{' divided by the time scale' if run.modeled else ''}. Cells above "
            f"{analysis.ERROR_SHARE:.0%} of their median TTFT are flagged."
        ),
        show(
            f.error,
            "placement",
            "cache",
            "context_tokens",
            "turn",
            "n",
            "median_ttft_s",
            "median_modeled_s",
            "median_error_s",
            "p90_error_s",
            "error_share",
            "flagged",
        ),
    ]
