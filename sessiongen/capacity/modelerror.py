"""The planner's own error: how far a planned session gain strays from the measured one.

A plan's interval holds the sessions' spread and the profile's parameter draws; what the
model itself gets wrong is a third term, a log-scale standard
deviation per *regime*:

- ``one_in_flight``: a closed loop with one session in flight on the pair;
- ``loaded``: more in flight (or open-loop arrivals), both cache arms stable.

(Cells with an unstable arm are a third regime, saturated, that nothing here estimates.)

Two sources, the same table shape (:data:`REGIMES`, ``cells_<regime>``, ``source``):

- :func:`default_model_error`: the shipped default of built-in profiles, from the
  project's own held-out validation on the real CPU pair (``model_error.toml``, the
  rows ``bench/heldout_decision.py`` printed), by the median absolute error;
- :func:`heldout_model_error`: ``sessiongen fit RUN... --heldout RUN2...``: each
  held-out replay (both cache arms) planned with the just-fitted profile as
  ``sessiongen plan`` plans it, both sides reduced by the same functions
  (:mod:`.heldout`), the error per cell taken less the measured gain's own sampling
  variance (:func:`sigma_from_errors`).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from sessiongen import scenario
from sessiongen.analysis import structure
from sessiongen.analysis.payoff import (
    ARM,
    DEFAULT_PAYS_AT,
    arm_stability,
    pooled,
    whatif_rows,
    with_verdicts,
)
from sessiongen.capacity import heldout
from sessiongen.capacity.decision import profile_draws, replicate_sets
from sessiongen.capacity.uncertainty import Z95
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.errors import UserError
from sessiongen.infra.tomlfile import read_toml
from sessiongen.records.run import Run, load_run

__all__ = [
    "DEFAULTS_FILE",
    "HELDOUT_REPLICATES",
    "REGIMES",
    "default_model_error",
    "heldout_cells",
    "heldout_model_error",
    "regime",
    "sigma_from_errors",
]

REGIMES = ("one_in_flight", "loaded")
DEFAULTS_FILE = Path(__file__).resolve().parent / "model_error.toml"
#: The median of |X| for X ~ N(0, sigma^2) is 0.6745 sigma (the normal's 75th percentile).
NORMAL_MEDIAN_ABS = 0.6745
#: Plan replicates per held-out run (seeds and the profile's draws), as the project's
#: held-out bench plans them (``bench/heldout_decision.py --seeds 10``).
HELDOUT_REPLICATES = 10


def regime(load_level: float | None, *, closed: bool) -> str:
    """A cell's regime (module doc): one in flight on a closed loop, else loaded."""
    one = closed and (load_level is None or float(load_level) == 1.0)
    return "one_in_flight" if one else "loaded"


def sigma_from_errors(errors: Sequence[float], sampling_se: Sequence[float]) -> float:
    """The model's log-scale error from held-out cells, its sampling noise taken out.

    Per cell ``i``, ``e_i = log(planned gain / measured gain)``. Write the log of the
    true gain ``g_i``; the model plans ``g_i + d_i``, with ``d_i`` the model's error
    (spread ``sigma``), and the replay measures ``g_i + s_i``, with ``s_i`` the
    measurement's sampling error (its standard error ``se_i``, known from the measured
    interval), independent of ``d_i``. Then ``e_i = d_i - s_i`` and
    ``E[e_i^2] = sigma^2 + mean(d)^2 + se_i^2``: the mean square of the errors counts a
    bias as error (an interval has to cover it as much as spread), and the measured
    gains' own variance is in it too. The method-of-moments estimate is therefore

        sigma^2 = mean(e_i^2) - mean(se_i^2),

    floored at 0 (where the measurements' noise alone explains the errors). The planned
    gain's own sampling variance stays in (it is small: the plan pools its replicates),
    so the estimate errs wide. NaN without cells.
    """
    e = np.asarray(errors, dtype=np.float64)
    se = np.asarray(sampling_se, dtype=np.float64)
    if e.size == 0:
        return math.nan
    return math.sqrt(max(0.0, float(np.mean(e * e)) - float(np.mean(se * se))))


def default_model_error(path: Path = DEFAULTS_FILE) -> dict[str, float | str]:
    """The shipped model error of built-in profiles: per regime, from the project's
    held-out validation (``model_error.toml``).

    The file gives, per (KV size, sessions in flight), the median and worst of
    ``|planned / measured - 1|`` over its cells. For a normal error the median of its
    absolute value is 0.6745 sigma, so ``sigma = median |e| / 0.6745``. Two readings
    bridge the file to that: (a) the relative error ``m`` has lost its sign, and on the
    log scale it is ``log(1 + m)`` or ``-log(1 - m)``; their mean, ``atanh(m)``, is
    taken; (b) a regime's cells are spread over rows of equal cell counts, and the
    regime's median is read as the cell-weighted mean of its rows' medians.
    ``one_in_flight``: the rows at 1 in flight; ``loaded``: at 2 and 4. The measured
    gains' sampling noise is inside these errors (the file has no intervals), so these
    sigmas err wide, most under load, where the measured intervals were widest.
    """
    data = read_toml(path)
    validation = data.get("validation") or {}
    rows = validation.get("cells") or []
    out: dict[str, float | str] = {}
    for name in REGIMES:
        mine = [r for r in rows if regime(r["in_flight"], closed=True) == name]
        cells = sum(int(r["cells"]) for r in mine)
        if not cells:
            raise UserError(f"{path}: validation.cells: no rows of regime {name}")
        median = sum(math.atanh(float(r["median_abs_error"])) * int(r["cells"]) for r in mine)
        out[name] = median / cells / NORMAL_MEDIAN_ABS
        out[f"cells_{name}"] = cells
    out["source"] = (
        f"shipped default: the project's held-out validation on the real CPU pair "
        f"({validation.get('date')}, {validation.get('command')}, commit "
        f"{str(validation.get('commit'))[:12]}): median |error| / 0.6745"
    )
    return out


def _plan_rows(run: Run, profile_file: Path, work: Path, replicates: int) -> pl.DataFrame:
    """The held-out run's own scenario planned with the profile as ``sessiongen plan``
    plans a configuration: ``replicates`` replicates (seeds and the profile's draws),
    pooled, with the arms' stability and verdicts. The run's pair structure (KV cache,
    scheduler limits, pool) wins over the profile's: it is that pair being predicted."""
    sim = read_toml(profile_file).get("target", {}).get("sim", {})
    kv = sim.get("kv_bytes_per_token")
    raw = dict(run.meta.scenario)
    told = structure.structure(run.meta, kv_bytes_per_token=kv)
    raw["target"] = {"kind": "sim", "sim": {"profile": str(profile_file), **told}}
    source = str(run.path / "manifest.json")
    base = scenario.from_dict(raw, source=source)
    draws = profile_draws(base)
    count = min(replicates, len(draws) + 1) if draws else replicates
    runs = []
    for k in range(count):
        sets = replicate_sets(k, base.seed, draws)
        sc = scenario.from_dict(dict(raw), source=source, overrides=sets)
        runs.append(load_run(virtual_replay(sc, work, run_id=f"{run.run_id}-r{k}")))
    rows = whatif_rows(pooled(runs)).join(arm_stability(runs), on=ARM, how="left",
                                          nulls_equal=True)  # fmt: skip
    return with_verdicts(rows, DEFAULT_PAYS_AT)


def _regime(closed: bool) -> pl.Expr:
    """:func:`regime` of each row's ``load_level``."""
    one = pl.col("load_level").is_null() | (pl.col("load_level") == 1)
    return pl.when(pl.lit(closed) & one).then(pl.lit(REGIMES[0])).otherwise(pl.lit(REGIMES[1]))


def heldout_table(
    profile_file: Path, run_dir: str | Path, work: Path, *, replicates: int = HELDOUT_REPLICATES
) -> pl.DataFrame:
    """One held-out run (both cache arms) against its own scenario planned with the
    profile on the run's pair structure: :func:`sessiongen.capacity.heldout.compare`'s
    table, with each cell's measured arm stability (``stable_off``, ``stable_on``)."""
    run = load_run(run_dir)
    if {"off", "on"} - set(run.ok["cache"].unique().to_list()):
        raise UserError(
            f"{run_dir}: --heldout: a held-out run must hold both cache arms "
            "(merge single-arm runs with `sessiongen merge`)"
        )
    measured = heldout.measured_decision(run, DEFAULT_PAYS_AT)
    planned = _plan_rows(run, profile_file, work, replicates)
    table = heldout.compare(planned, measured)
    stable = measured.select(*ARM, "stable_off", "stable_on")
    return table.join(stable, on=ARM, how="left", nulls_equal=True)


def heldout_cells(
    profile_file: Path,
    run_dirs: Sequence[str | Path],
    *,
    replicates: int = HELDOUT_REPLICATES,
) -> pl.DataFrame:
    """Per held-out cell: run, placement, context, level, regime, the planned and
    measured session gains, ``e`` = log(planned / measured) and the measured gain's
    log-scale standard error ``se`` from its 95% interval. Cells without a measured
    interval, or with an arm unstable in the measurement, are left out."""
    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, run_dir in enumerate(run_dirs):
            table = heldout_table(profile_file, run_dir, Path(tmp) / str(i), replicates=replicates)
            run = load_run(run_dir)
            load = run.meta.scenario.get("load") or {}
            closed = load.get("arrival", "closed") == "closed"
            frames.append(
                table.select(
                    pl.lit(run.run_id).alias("run"),
                    *ARM,
                    _regime(closed).alias("regime"),
                    pl.col("session_gain_planned").alias("planned"),
                    pl.col("session_gain_measured").alias("measured"),
                    (pl.col("session_gain_planned") / pl.col("session_gain_measured"))
                    .log()
                    .alias("e"),
                    (
                        (
                            pl.col("session_gain_measured_high").log()
                            - pl.col("session_gain_measured_low").log()
                        )
                        / (2 * Z95)
                    ).alias("se"),
                    (
                        pl.col("stable_off").fill_null(True) & pl.col("stable_on").fill_null(True)
                    ).alias("stable"),
                )
            )
    cells = pl.concat(frames)
    usable = pl.col("e").is_finite() & pl.col("se").is_finite() & pl.col("stable")
    return cells.filter(usable).drop("stable")


def heldout_model_error(
    profile_file: Path,
    run_dirs: Sequence[str | Path],
    *,
    replicates: int = HELDOUT_REPLICATES,
) -> dict[str, float | str]:
    """The ``[fit.model_error]`` table from held-out runs (module doc): per regime with
    cells, :func:`sigma_from_errors` and its cell count; the source names the runs."""
    cells = heldout_cells(profile_file, run_dirs, replicates=replicates)
    out: dict[str, float | str] = {}
    for name in REGIMES:
        mine = cells.filter(pl.col("regime") == name)
        if mine.is_empty():
            continue
        out[name] = sigma_from_errors(mine["e"].to_list(), mine["se"].to_list())
        out[f"cells_{name}"] = mine.height
    if not out:
        raise UserError("--heldout: no held-out cell with a measured interval and both arms stable")
    names = ", ".join(Path(d).name for d in run_dirs)
    out["source"] = (
        f"sessiongen fit --heldout {names}: root mean square of log(planned / measured "
        f"session gain) less the measured gains' sampling variance, {replicates} plan "
        "replicates a run"
    )
    return out
