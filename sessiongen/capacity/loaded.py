"""The profile's loaded terms, fitted by planning the loaded runs under each candidate.

Requests that ran alone (:mod:`.fit`) tell every term one request pays by itself; they
cannot tell what requests that share a replica do to each other:

- decode batching, ``itl_per_batch_s``: the step time each further sequence in the
  decode batch adds;
- whether a pool load holds the engine step (``pool_load_mode = "sync"``: every
  request in the batch waits for it) or runs beside the steps (``"async"``: only the
  loading request waits; LMCache and vLLM both have such a path).

(A third loaded term, the pool's store cost on a miss, is a term every
cold request of the pool-on arm pays alone: the alone fit measures it from both arms.)

No closed form gives these from a run's records (a request's decode gaps hold the others'
prefill chunks, loads and decodes in proportions only the scheduler knows), so the fit
uses the scheduler itself: each candidate (a mode and a batching cost on a grid of
multiples of the fitted ``itl_base_s``, then :data:`FINE` values between the best
one's neighbours in the best mode) plans the loaded runs' own scenario on the
virtual clock with the alone fit's profile, and every request is compared with its
measured twin (same arm, level, block, session and turn) by ``|log(planned TTFT /
measured)| + |log(planned decode time / measured)|`` (decode time = e2e - TTFT). The
loss is summed per session; the candidate with the least total is the fit.

How sure: the sessions are resampled (stratified by arm, level and context, seeded;
turns of a session are not independent) and each resample's best candidate taken (kept,
in resample order, as the profile's parameter draws: :attr:`LoadedFit.choices`). The
mode is *identified* when one mode wins in at least :data:`MODE_SHARE` of resamples; the
batching cost's interval is the 2.5 and 97.5 percentiles of the resamples' best values
(on the candidates, so no finer than the fine grid's steps; the mode is judged on the
coarse grid, where both modes have the same values; a resample whose best
candidates tie spans them all), and it is *not identified* when that interval
runs from the grid's lowest value to its highest. What the plans cannot reproduce
stays in the residual (per level, the median of each request's planned / measured - 1),
which is reported: on a CPU pair whose replicas share the host's cores, contention no
per-replica model has shows there and in the batching cost.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from tqdm import tqdm

from sessiongen import scenario
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.errors import UserError
from sessiongen.records.run import Run, load_run

__all__ = [
    "BATCH_MULTIPLES",
    "MODES",
    "LoadedFit",
    "fit_loaded",
    "is_loaded",
    "summary_lines",
]

#: Candidate decode-batching costs, as multiples of the fitted ``itl_base_s``.
BATCH_MULTIPLES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0)
#: Further values between the best coarse value's neighbours (its mode only).
FINE = 7
MODES = ("sync", "async")
RESAMPLES = 1000
#: Share of resamples one mode must win for the mode to count as identified.
MODE_SHARE = 0.95
CONFIDENCE = 0.95
#: Totals within this share of the least are ties (the planner's rounding, not a win).
TIE = 1e-9
#: A request's twin in the plan: the same cell, block, session and turn.
KEYS = ["placement", "cache", "load_level", "block_in_placement", "session_index", "turn"]
SESSION = ["run", "placement", "cache", "load_level", "block_in_placement", "session_index"]
STRATUM = ["run", "placement", "cache", "load_level", "context_tokens"]


@dataclass(frozen=True)
class LoadedFit:
    """The loaded terms: values, how sure, and what they stood on."""

    itl_per_batch_s: float
    pool_load_mode: str
    batch_low: float
    batch_high: float
    mode_share: float  # share of resamples whose best candidate has the chosen mode
    losses: pl.DataFrame  # pool_load_mode, itl_per_batch_s, loss (mean per session)
    residuals: pl.DataFrame  # per load level: requests, median TTFT and decode errors
    requests: int
    sessions: int
    resamples: int
    not_identified: dict[str, str] = field(default_factory=dict)
    # each resample's best candidate (mode, batching cost), in resample order; of tied
    # candidates the first (the coarse grid's order: sync before async, low cost first)
    choices: tuple[tuple[str, float], ...] = ()

    def profile(self) -> dict[str, float | str]:
        """The profile keys this fit sets."""
        return {"itl_per_batch_s": self.itl_per_batch_s, "pool_load_mode": self.pool_load_mode}

    def draw(self, i: int) -> dict[str, float | str]:
        """The profile keys of resample ``i``'s best candidate; a term the runs do not
        identify keeps the fitted value (its resamples' choices are ties, not news)."""
        mode, batch = self.choices[i]
        out = self.profile()
        if "itl_per_batch_s" not in self.not_identified:
            out["itl_per_batch_s"] = batch
        if "pool_load_mode" not in self.not_identified:
            out["pool_load_mode"] = mode
        return out


def is_loaded(run: Run) -> bool:
    """Whether a run holds requests that shared their replica with others: sessions in
    flight together (closed loop above one) or open-loop arrivals."""
    load = run.meta.scenario.get("load") or {}
    if load.get("arrival", "closed") != "closed":
        return True
    levels = run.ok["load_level"].drop_nulls()
    if (levels > 1).any():
        return True
    driver = run.meta.scenario.get("driver") or {}
    return int(driver.get("concurrency") or 1) > 1


def _measured(runs: Sequence[Run]) -> pl.DataFrame:
    frames = []
    for index, run in enumerate(runs):
        rows = run.ok.filter(~pl.col("warmup") & pl.col("session_index").is_not_null())
        frames.append(
            rows.select(
                pl.lit(index).alias("run"),
                *KEYS[:-2],
                "session_index",
                "turn",
                "context_tokens",
                pl.col("ttft_s").alias("ttft_m"),
                (pl.col("e2e_s") - pl.col("ttft_s")).alias("decode_m"),
            ).with_columns(pl.col("load_level").fill_null(1.0))
        )
    return pl.concat(frames)


def _plan_scenario(run: Run, profile_file: Path, mode: str, batch: float) -> scenario.Scenario:
    """The run's own scenario, on the simulated pair with the profile and one candidate."""
    raw = dict(run.meta.scenario)
    sim = {"profile": str(profile_file), "itl_per_batch_s": batch, "pool_load_mode": mode}
    raw["target"] = {"kind": "sim", "sim": sim}
    return scenario.from_dict(raw, source=str(run.path / "manifest.json"))


def _planned(runs: Sequence[Run], profile_file: Path, mode: str, batch: float, work: Path) -> Any:
    frames = []
    for index, run in enumerate(runs):
        sc = _plan_scenario(run, profile_file, mode, batch)
        folder = virtual_replay(sc, work, run_id=f"{mode}-{batch:.6g}-{index}")
        planned = load_run(folder).ok.filter(~pl.col("warmup"))
        frames.append(
            planned.select(
                pl.lit(index).alias("run"),
                *KEYS,
                pl.col("ttft_s").alias("ttft_p"),
                (pl.col("e2e_s") - pl.col("ttft_s")).alias("decode_p"),
            ).with_columns(pl.col("load_level").fill_null(1.0))
        )
    return pl.concat(frames)


def _losses(measured: pl.DataFrame, planned: pl.DataFrame) -> pl.DataFrame:
    """Per session of ``measured``: the summed loss against ``planned`` (module doc)."""
    joined = measured.join(planned, on=["run", *KEYS], how="inner")
    if joined.height < measured.height:
        raise UserError(
            f"the plan of the loaded run lacks {measured.height - joined.height} of its "
            "requests (was the run's scenario changed?)"
        )
    ttft = (pl.col("ttft_p") / pl.col("ttft_m")).log().abs()
    decode = (pl.col("decode_p") / pl.col("decode_m")).log().abs()
    decode = pl.when((pl.col("decode_m") > 0) & (pl.col("decode_p") > 0)).then(decode)
    per = joined.with_columns(loss=ttft + decode.fill_null(0.0))
    return per.group_by(SESSION).agg(pl.col("loss").sum()).sort(SESSION)


def _residuals(measured: pl.DataFrame, planned: pl.DataFrame) -> pl.DataFrame:
    joined = measured.join(planned, on=["run", *KEYS], how="inner")
    return (
        joined.group_by("load_level")
        .agg(
            n=pl.len(),
            ttft_error=(pl.col("ttft_p") / pl.col("ttft_m") - 1).median(),
            decode_error=(pl.col("decode_p") / pl.col("decode_m") - 1).median(),
        )
        .sort("load_level")
    )


def fit_loaded(
    run_dirs: Sequence[str | Path],
    profile_file: Path,
    itl_base_s: float,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    work_dir: Path | None = None,
    progress: bool = False,
) -> LoadedFit:
    """Fit the loaded terms to the loaded runs in ``run_dirs`` (module doc), planning
    them with the profile in ``profile_file`` (the alone fit's). ``progress``: a bar
    over the candidates' plans on a terminal."""
    runs = [load_run(d) for d in run_dirs]
    measured = _measured(runs)
    if measured.is_empty():
        raise UserError("loaded runs: no session requests to fit the loaded terms to")
    batches = sorted({round(m * itl_base_s, 12) for m in BATCH_MULTIPLES})
    candidates: list[tuple[str, float]] = []
    columns: list[np.ndarray[Any, Any]] = []
    plans: dict[int, pl.DataFrame] = {}
    sessions = pl.DataFrame()
    total = len(MODES) * len(batches) + FINE
    bar = tqdm(total=total, desc="loaded terms: plans", unit="plan", disable=not progress or None)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp, bar:
        work = Path(tmp)

        def evaluate(mode: str, batch: float) -> None:
            nonlocal sessions
            i = len(candidates)
            planned = _planned(runs, profile_file, mode, batch, work / str(i))
            per = _losses(measured, planned)
            candidates.append((mode, batch))
            columns.append(per["loss"].to_numpy())
            sessions = per.select(SESSION)
            plans[i] = planned
            bar.update(1)

        for mode in MODES:
            for b in batches:
                evaluate(mode, b)
        # Then finer between the best coarse value's neighbours, in the best mode.
        best = int(np.argmin([c.sum() for c in columns]))
        mode, batch = candidates[best]
        j = batches.index(batch)
        lo, hi = batches[max(j - 1, 0)], batches[min(j + 1, len(batches) - 1)]
        for b in np.linspace(lo, hi, FINE + 2)[1:-1].tolist():
            if round(b, 12) not in batches:
                evaluate(mode, round(b, 12))
    loss = np.column_stack(columns)  # sessions x candidates
    best = int(np.argmin(loss.sum(axis=0)))
    totals = _resampled_totals(loss, sessions, measured, resamples, seed)
    coarse = len(MODES) * len(batches)  # both modes at the same values: the mode's test
    mode, batch = candidates[best]
    # A resample whose best candidates (within rounding) hold both modes is no win.
    modes = [{candidates[i][0] for i in t} for t in _least(totals[:, :coarse])]
    mode_share = float(np.mean([m == {mode} for m in modes]))
    tied = float(np.mean([len(m) > 1 for m in modes]))
    ties = _least(totals)
    choices = tuple(candidates[t[0]] for t in ties)
    lows = np.array([min(candidates[i][1] for i in t) for t in ties])
    highs = np.array([max(candidates[i][1] for i in t) for t in ties])
    tail = (1 - CONFIDENCE) / 2
    low, high = float(np.quantile(lows, tail)), float(np.quantile(highs, 1 - tail))
    unknown: dict[str, str] = {}
    if mode_share < MODE_SHARE and tied >= 0.5:
        unknown["pool_load_mode"] = (
            f"both modes plan these runs alike in {tied:.0%} of resamples: no pool load "
            "overlaps another request's steps"
        )
    elif mode_share < MODE_SHARE:
        unknown["pool_load_mode"] = (
            f"{mode} best in {mode_share:.0%} of resamples (needs {MODE_SHARE:.0%})"
        )
    if low <= batches[0] and high >= batches[-1]:
        unknown["itl_per_batch_s"] = (
            f"its interval spans the whole grid [{batches[0]:.3g}, {batches[-1]:.3g}] s"
        )
    table = pl.DataFrame(
        {
            "pool_load_mode": [c[0] for c in candidates],
            "itl_per_batch_s": [c[1] for c in candidates],
            "loss": loss.mean(axis=0),
        }
    )
    return LoadedFit(
        itl_per_batch_s=batch,
        pool_load_mode=mode,
        batch_low=low,
        batch_high=high,
        mode_share=mode_share,
        losses=table,
        residuals=_residuals(measured, plans[best]),
        requests=measured.height,
        sessions=loss.shape[0],
        resamples=resamples,
        not_identified=unknown,
        choices=choices,
    )


def _least(totals: np.ndarray[Any, Any]) -> list[list[int]]:
    """Per row (a resample), the candidates of the least total and any within rounding
    of it (a loss no candidate changes leaves them all tied)."""
    least = totals.min(axis=1, keepdims=True)
    near = totals <= least + TIE * np.maximum(1.0, np.abs(least))
    return [np.flatnonzero(row).tolist() for row in near]


def _resampled_totals(
    loss: np.ndarray[Any, Any],
    sessions: pl.DataFrame,
    measured: pl.DataFrame,
    resamples: int,
    seed: int,
) -> np.ndarray[Any, Any]:
    """Each resample's total loss per candidate (resamples x candidates), sessions
    drawn with replacement within strata."""
    context = measured.group_by(SESSION).agg(pl.col("context_tokens").first())
    keyed = sessions.with_row_index("row").join(context, on=SESSION, how="left")
    groups = [g["row"].to_numpy() for _k, g in keyed.group_by(STRATUM, maintain_order=True)]
    rng = np.random.default_rng(seed)
    counts = np.zeros((resamples, loss.shape[0]))
    for k in range(resamples):
        for rows in groups:
            np.add.at(counts[k], rows[rng.integers(0, rows.size, rows.size)], 1.0)
    out: np.ndarray[Any, Any] = counts @ loss
    return out


def summary_lines(result: LoadedFit) -> list[str]:
    """The loaded terms with how sure the runs are of them, and the plans' residuals."""
    lines = [
        f"loaded terms, from {result.requests} requests ({result.sessions} sessions) of "
        "runs with sessions in flight together, by planning them under each candidate:"
    ]
    batch = "itl_per_batch_s"
    if batch in result.not_identified:
        why = f"not identified by these runs ({result.not_identified[batch]})"
    else:
        why = f"[{result.batch_low:.4g}, {result.batch_high:.4g}] on the grid"
    lines.append(f"  {batch:<24} {result.itl_per_batch_s:12.6g}  {why}")
    mode = "pool_load_mode"
    share = f"best in {result.mode_share:.0%} of resamples"
    if mode in result.not_identified:
        share = f"not identified by these runs ({result.not_identified[mode]})"
    lines.append(f"  {mode:<24} {result.pool_load_mode:>12}  {share}")
    lines.append(
        f"intervals: {CONFIDENCE:.0%} percentile bootstrap of the best candidate, unit: "
        f"session ({result.sessions} sessions, resampled within arm, level and context); "
        f"{result.resamples} resamples"
    )
    lines.append("loaded residuals (planned / measured - 1, median per level):")
    for r in result.residuals.iter_rows(named=True):
        decode = r["decode_error"]
        decode_text = "n/a" if decode is None or math.isnan(decode) else f"{decode:+.1%}"
        lines.append(
            f"  {r['load_level']:>6g} in flight n={r['n']:<4} TTFT {r['ttft_error']:+.1%}, "
            f"decode time {decode_text}"
        )
    return lines
