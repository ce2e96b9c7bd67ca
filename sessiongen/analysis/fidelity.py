"""Whether a run's measurements can be read as the cache's effect.

- **Measurement error** (simulated runs): how far the client's TTFT strays from what
  the simulator modeled;
- **cold-turn asymmetry**: whether the arms differ where the cache cannot help.

The simulated replicas report each request's modeled TTFT (``server_ttft_s``, stored
times the time scale like every duration, so modeled seconds after loading). The client
measures TTFT itself (``ttft_s``). Their difference is the **measurement error**: the
client's own overhead, loopback, and the simulator's lateness against its deadline, all
multiplied by 1 / time scale. It is reported per arm and turn, in modeled seconds and
as a share of the cell's median TTFT; a cell whose median error exceeds
:data:`ERROR_SHARE` (2%) is flagged, because then differences between arms of that
size could be the clock, not the cache. The remedy is a larger time scale.

Real servers report no TTFT of their own (``server_ttft_s`` is null), and a run whose
target is not simulated never gets this table, whatever its records hold.

- **Lag effect** (every run): a request is lag-flagged (``loop_lag_flag``) when the
  client's event loop stalled for more than 2% of its TTFT while it waited (the column's
  definition in :mod:`sessiongen.records.format`). A flag says a timestamp *could* have
  moved, not that a figure did: on the simulated pair flagged requests erred by a median
  1.0% and unflagged ones by up to 3.8%. So the evidence per cell is whether its median
  moves when each flagged request takes its session's unflagged TTFT from the cell's
  other blocks: a cell is ``moved`` when that shifts it by more than
  :data:`ERROR_SHARE`, and only moved cells are a problem.
"""

from __future__ import annotations

import polars as pl

from sessiongen.analysis.latency import speedup_table
from sessiongen.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

#: A cell is flagged when its median measurement error exceeds this share of its median TTFT.
ERROR_SHARE = 0.02


def measurement_error(run: Run) -> pl.DataFrame:
    """Per arm and turn: median TTFT, the modeled median, the error's median and p90, its
    share of the median TTFT, and ``flagged`` (share above :data:`ERROR_SHARE`); empty
    for a target that is not simulated."""
    rows = run.ok.filter(pl.col("server_ttft_s").is_not_null(), pl.lit(run.simulated))
    error = pl.col("ttft_s") - pl.col("server_ttft_s")
    return (
        rows.group_by(list(CELL_KEYS))
        .agg(
            n=pl.len(),
            median_ttft_s=pl.col("ttft_s").median(),
            median_modeled_s=pl.col("server_ttft_s").median(),
            median_error_s=error.median(),
            p90_error_s=error.quantile(0.9, interpolation="higher"),
        )
        .with_columns(error_share=pl.col("median_error_s") / pl.col("median_ttft_s"))
        .with_columns(flagged=pl.col("error_share").abs() > ERROR_SHARE)
        .sort(list(CELL_KEYS))
    )


def lag_effect(run: Run) -> pl.DataFrame:
    """Per arm and turn: requests, lag-flagged ones (``unverifiable``: those without such
    a sibling, which no figure can be checked against), the median TTFT as measured and with
    each flagged request replaced by the same session's unflagged TTFT in the cell's other
    blocks (the same prompt and truth; kept as measured where there is none), the shift as
    a share, and ``moved`` (a stall only delays, so: the measured median above the other by
    more than :data:`ERROR_SHARE`). Leaving flagged requests out
    instead would leave other sessions in, and sessions differ by more than 2%."""
    flag = pl.col("loop_lag_flag").fill_null(False)
    unit = [*CELL_KEYS, "session_index"]
    rows = run.ok.with_columns(_flag=flag)
    reference = (
        rows.filter(~pl.col("_flag"), pl.col("session_index").is_not_null())
        .group_by(unit)
        .agg(_ref=pl.col("ttft_s").median())
    )
    joined = rows.join(reference, on=unit, how="left", nulls_equal=True)
    counterfactual = (
        pl.when(pl.col("_flag") & pl.col("_ref").is_not_null())
        .then(pl.col("_ref"))
        .otherwise(pl.col("ttft_s"))
    )
    return (
        joined.group_by(list(CELL_KEYS))
        .agg(
            n=pl.len(),
            lagged=pl.col("_flag").sum(),
            unverifiable=(pl.col("_flag") & pl.col("_ref").is_null()).sum(),
            median_ttft_s=pl.col("ttft_s").median(),
            median_unlagged_s=counterfactual.median(),
        )
        .with_columns(
            shift=(pl.col("median_ttft_s") / pl.col("median_unlagged_s") - 1).fill_nan(None)
        )
        .with_columns(moved=(pl.col("shift") > ERROR_SHARE).fill_null(False))
        .sort(list(CELL_KEYS))
    )


#: Cold first turns of the two arms may differ by this much before it is called out.
COLD_TOLERANCE = 0.05
#: ... except that the ON arm may be slower by up to this much: on a miss the pool
#: stores the prompt's KV, a cost of the cache itself, paid in CPU. Measured on the CPU
#: pair with one core per replica: ON/OFF cold TTFT 0.96-1.10 over four paired runs on a
#: quiet machine (+0.1 s of worker CPU per cold 8k prompt), and 1.26 beside a CPU hog
#: (the store's CPU work waits for a core too); 0.4 leaves room for noise above that.
#: The fault this check exists for, arms on different cores, made OFF 1.5-1.6x slower.
STORE_COST_TOLERANCE = 0.4


def cold_turn_asymmetry(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pl.DataFrame:
    """Cold first turns, OFF against ON, per placement and context size.

    Nothing is cached on a first turn in either arm, so the arms should take the same
    time there. The ratio median TTFT(OFF) / median TTFT(ON) of turn 1 comes with the
    speedup's interval (paired by session where the arms replay the same sessions); a
    pair of arms is ``flagged`` when the interval excludes 1 and the ON arm is more than
    :data:`COLD_TOLERANCE` faster, or more than :data:`STORE_COST_TOLERANCE` slower (the
    pool's own cost of storing on a miss). Then the arms differ beyond the cache (their
    processes, CPU contention, start-up work), and no speedup of the run can be read as
    the cache's alone. In a trace, first turns may share prefixes with earlier requests
    (and the pool may serve them under ON): only those the trace says share nothing
    (``trace_shared_blocks`` 0) are cold, often a single one, and one unit's interval is
    a point: a pair of arms is flagged only with at least two units.
    """
    cold = pl.col("turn") == 1
    if run.trace:
        cold = cold & (pl.col("trace_shared_blocks").fill_null(0) == 0)
    first = speedup_table(run.filter(cold), boot=boot).drop("turn")
    ratio = pl.col("speedup")
    outside = (pl.col("speedup_ci_low") > 1.0) | (pl.col("speedup_ci_high") < 1.0)
    beyond = (ratio > 1.0 + COLD_TOLERANCE) | (ratio < 1.0 / (1.0 + STORE_COST_TOLERANCE))
    enough = pl.col("n_units") >= 2
    return first.with_columns(flagged=(outside & beyond & enough).fill_null(False))


def trust_warnings(run: Run, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> list[str]:
    """One line per reason the run's speedups cannot be read as the cache's effect."""
    out = []
    cold = cold_turn_asymmetry(run, boot=boot).filter(pl.col("flagged"))
    for row in cold.iter_rows(named=True):
        out.append(
            f"warning: arms differ beyond the cache: cold first turns ({row['placement']}, "
            f"context {row['context_tokens']}) OFF/ON {row['speedup']:.2f}x "
            f"[{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]; no speedup of "
            "this run can be read as the cache's alone"
        )
    errors = measurement_error(run).filter(pl.col("flagged"))
    if not errors.is_empty():
        worst = float(errors.select(pl.col("error_share").abs().max()).item())
        out.append(
            f"warning: measurement error above {ERROR_SHARE:.0%} of the median TTFT in "
            f"{errors.height} cells (worst {worst:.1%}); {time_scale_remedy(run)}"
        )
    return out


def time_scale_remedy(run: Run) -> str:
    """How to make a simulated run's measurement error smaller: a larger time scale,
    where the run's target sets it."""
    if run.meta.target_kind == "sim":
        return "raise target.sim.time_scale"
    return "serve the simulated replicas at a larger --time-scale"
