"""Does the planner say what the served simulator does? Per-turn agreement of two runs.

The planner (:mod:`.virtual`) and the served simulator share one engine; a replay on
the simulated pair and a plan of the same scenario must agree per turn. They are
compared on the simulator's own modeled TTFT (``server_ttft_s``, the engine's account
of each request), which leaves out the client's measurement error; a replay's
measured TTFT is compared too, and differs by that error (``analysis.fidelity``).

Where requests contend (concurrency above one, open-loop arrivals that overlap), the
served replay's order of nearly simultaneous arrivals follows the wall clock (when the
client's sends leave, how long the simulator takes to parse each body), so one served
replay differs from the next there, and from the planner by as much.
"""

from __future__ import annotations

import polars as pl

from sessiongen.records.run import Run

#: A cell of the comparison: an arm (load level included) and a turn.
CELL = ["placement", "cache", "context_tokens", "load_level", "turn"]


def per_turn(planned: Run, served: Run, column: str = "server_ttft_s") -> pl.DataFrame:
    """Per cell: both runs' median of ``column`` (modeled seconds), their relative
    difference (planned / served - 1), and whether any request of the cell waited for
    admission in either run (``contended``)."""

    def medians(run: Run) -> pl.DataFrame:
        ok = run.ok.with_columns(pl.col("load_level").fill_null(1.0))
        return ok.group_by(CELL).agg(
            pl.col(column).median().alias("median_s"),
            (pl.col("server_queue_s").fill_null(0.0) > 0).any().alias("queued"),
            pl.len().alias("n"),
        )

    both = medians(planned).join(medians(served), on=CELL, how="full", coalesce=True,
                                 suffix="_served")  # fmt: skip
    return both.select(
        *CELL,
        pl.col("median_s").alias("planned_s"),
        pl.col("median_s_served").alias("served_s"),
        (pl.col("median_s") / pl.col("median_s_served") - 1).alias("difference"),
        (pl.col("queued") | pl.col("queued_served")).alias("contended"),
        pl.col("n"),
        pl.col("n_served"),
    ).sort(CELL)
