"""The planner's own error: how far a planned session gain strays from the measured one.

A plan's interval holds the sessions' spread and the profile's parameter draws; what the
model itself gets wrong is a third term, a log-scale standard
deviation per *regime*:

- ``one_in_flight``: a closed loop with one session in flight on the pair;
- ``loaded``: more in flight (or open-loop arrivals), both cache arms stable.

(Cells with an unstable arm are a third regime, saturated, that nothing here estimates.)

Two sources, the same table shape (:data:`REGIMES`, ``cells_<regime>``, ``source``):

- :func:`default_model_error`: the shipped default of built-in profiles, from the
  held-out cells of the project's pre-registered validation on the real CPU pair
  (``model_error.toml``'s ``[heldout]``);
- :func:`heldout_model_error`: ``sessiongen fit RUN... --heldout RUN2...``: each
  held-out replay (both cache arms) planned with the just-fitted profile as
  ``sessiongen plan`` plans it, both sides reduced by the same functions
  (:mod:`.heldout`).

Both estimate a regime's sigma the same way, from its cells' errors and the measured
gains' standard errors: :func:`sigma_upper`, the 95% upper confidence bound, net of the
measured gains' sampling variance. The point estimate (:func:`sigma_from_errors`) is
beside it in the docs, not in the interval: from eight cells it can be zero (the
validation's loaded cells: their errors are no larger than their measurements' noise),
which would call the model exact; the bound says how large an error those cells leave
possible, and tightens as cells are added.
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
    "sigma_upper",
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


def sigma_upper(
    errors: Sequence[float], sampling_se: Sequence[float], confidence: float = 0.95
) -> float:
    """The model's log-scale error from held-out cells: the ``confidence`` upper bound.

    With :func:`sigma_from_errors`' model (``e_i = d_i - s_i``, the model's error ``d_i``
    of spread ``sigma`` and a bias counted as error, the measurement's ``s_i`` of known
    ``se_i``), ``e_i / sqrt(sigma^2 + se_i^2)`` is a standard normal, so
    ``Q(sigma) = sum e_i^2 / (sigma^2 + se_i^2)`` is chi-square with ``n`` degrees of
    freedom at the true sigma. ``Q`` falls as sigma grows; the bound is the sigma where
    ``Q`` reaches the chi-square's ``1 - confidence`` quantile (a larger sigma would make
    errors this large improbably small). 0 where even ``sigma = 0`` leaves ``Q`` below
    it; NaN without cells.
    """
    e = np.asarray(errors, dtype=np.float64)
    se = np.asarray(sampling_se, dtype=np.float64)
    if e.size == 0:
        return math.nan
    target = chi2_quantile(1 - confidence, e.size)

    def q(sigma: float) -> float:
        return float(np.sum(e * e / (sigma * sigma + se * se + 1e-300)))

    if q(0.0) <= target:
        return 0.0
    low, high = 0.0, 1.0
    while q(high) > target:
        high *= 2
    for _ in range(200):  # bisection to the float's precision
        mid = (low + high) / 2
        low, high = (mid, high) if q(mid) > target else (low, mid)
    return high


def chi2_cdf(x: float, dof: int) -> float:
    """The chi-square distribution function at ``x`` for a whole number of degrees of
    freedom, in closed form (no scipy: a plan loads none of it): for even ``dof`` the
    Poisson tail ``1 - exp(-x/2) sum_{k < dof/2} (x/2)^k / k!``; for odd ``dof`` the
    normal's ``erf(sqrt(x/2))`` less ``sqrt(2x/pi) exp(-x/2) sum_{r < (dof-1)/2}
    x^r / (3 * 5 * ... * (2r+1))``."""
    if x <= 0:
        return 0.0
    if dof % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= (x / 2) / k
            total += term
        return max(0.0, 1.0 - math.exp(-x / 2) * total)
    term, total = 1.0, 0.0
    for r in range((dof - 1) // 2):
        if r:
            term *= x / (2 * r + 1)
        total += term
    return max(
        0.0, math.erf(math.sqrt(x / 2)) - math.sqrt(2 * x / math.pi) * math.exp(-x / 2) * total
    )


def chi2_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of the chi-square with ``dof`` degrees of freedom (bisection on
    :func:`chi2_cdf`)."""
    low, high = 0.0, float(dof) + 10.0 * math.sqrt(2.0 * dof) + 10.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_cdf(mid, dof) < p else (low, mid)
    return (low + high) / 2


def default_model_error(path: Path = DEFAULTS_FILE) -> dict[str, float | str]:
    """The shipped model error of built-in profiles: per regime, :func:`sigma_upper` of
    the held-out cells in ``model_error.toml`` (``[[heldout.cells]]``: ``regime``,
    ``e``, ``se``), with the cell count and the source."""
    data = read_toml(path)
    held = data.get("heldout") or {}
    rows = held.get("cells") or []
    out: dict[str, float | str] = {}
    for name in REGIMES:
        mine = [r for r in rows if r.get("regime") == name]
        if not mine:
            raise UserError(f"{path}: heldout.cells: no rows of regime {name}")
        out[name] = sigma_upper([float(r["e"]) for r in mine], [float(r["se"]) for r in mine])
        out[f"cells_{name}"] = len(mine)
    out["source"] = (
        f"shipped default: the project's pre-registered validation on the real CPU pair "
        f"({held.get('date')}, {held.get('source')}): the 95% upper bound of the model's "
        "log-scale error over its held-out cells, net of the measured gains' sampling "
        "noise, not measured on your replicas"
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
    cells, :func:`sigma_upper` and its cell count; the source names the runs."""
    cells = heldout_cells(profile_file, run_dirs, replicates=replicates)
    out: dict[str, float | str] = {}
    for name in REGIMES:
        mine = cells.filter(pl.col("regime") == name)
        if mine.is_empty():
            continue
        out[name] = sigma_upper(mine["e"].to_list(), mine["se"].to_list())
        out[f"cells_{name}"] = mine.height
    if not out:
        raise UserError("--heldout: no held-out cell with a measured interval and both arms stable")
    names = ", ".join(Path(d).name for d in run_dirs)
    out["source"] = (
        f"sessiongen fit --heldout {names}: the 95% upper bound of the model's log-scale "
        f"error (log planned / measured session gain) net of the measured gains' sampling "
        f"noise, {replicates} plan replicates a run"
    )
    return out
