"""compare knows its noise: cells whose own run-to-run noise (from several runs a side)
is above compare.NOISE_LEVEL are named in one warning line and widened by that noise;
below the level nothing changes. Seeded synthetic runs, counted outcomes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl

from sessiongen import analysis
from sessiongen.analysis.runnoise import DEFAULT_RUN_NOISE, NOISE_LEVEL
from sessiongen.records.format import CELL_KEYS
from tests.support.synthetic import SyntheticSpec, with_changes, write_run

#: smoke-like: 8 sessions, one placement, 6 turns (12 cells), 3% run effect per cell.
SPEC = SyntheticSpec(
    sessions=8,
    turns=6,
    placements=("alternate",),
    noise_sigma=0.02,
    session_sigma=0.1,
    run_sigma=0.03,
)


def _loud(run: analysis.Run, sigma: float, seed: int) -> analysis.Run:
    """Every fourth cell gets a run effect of its own, lognormal SD ``sigma``."""
    keys = list(CELL_KEYS)
    cells = run.requests.select(keys).unique().sort(keys)
    rng = np.random.default_rng(seed)
    noisy = np.arange(cells.height) % 4 == 0
    factor = np.where(noisy, rng.lognormal(0.0, sigma, cells.height), 1.0)
    cells = cells.with_columns(_f=pl.Series(factor))
    requests = run.requests.join(cells, on=keys).with_columns(pl.col("ttft_s") * pl.col("_f"))
    return dataclasses.replace(run, requests=requests.drop("_f"))


def _side(root: Path, seed: int, first: int, loud: float) -> list[analysis.Run]:
    runs = []
    for i in range(3):
        spec = with_changes(SPEC, seed=seed, noise_seed=first + i)
        run = analysis.load_run(write_run(root, spec, run_id=f"r{seed}-{first + i}"))
        runs.append(_loud(run, loud, seed * 100 + first + i) if loud else run)
    return runs


def _pair(
    root: Path, seed: int, loud: float
) -> tuple[analysis.Comparison, list[analysis.Run], list[analysis.Run]]:
    a, b = _side(root, seed, 10, loud), _side(root, seed, 20, loud)
    return analysis.compare_runs(a, b), a, b


def _warnings(result: analysis.Comparison) -> list[str]:
    return [n for n in result.notes if "run-to-run noise above" in n]


def test_loud_cells_are_named_widened_and_do_not_raise_false_alarms(tmp_path: Path) -> None:
    false_alarms = warned = 0
    pairs = 8
    for seed in range(pairs):
        result, a, b = _pair(tmp_path / str(seed), seed, loud=0.15)
        false_alarms += result.verdict == "slower"
        lines = _warnings(result)
        warned += len(lines) == 1
        noise = result.run_noise
        loud = {k for k, c in noise.cells.items() if c.loud}
        if lines:
            assert "/t" in lines[0] and "runs a side" in lines[0], lines
        for row in result.frame.iter_rows(named=True):
            key = tuple(row[k] for k in CELL_KEYS)
            sd, _ = noise.of(key)
            assert (sd > noise.sd) == (key in loud and noise.cells[key].upper > noise.sd)
        if loud:  # the named cells' intervals are wider than with the pooled noise alone
            flat = dataclasses.replace(noise, cells={})
            pooled = analysis.compare_runs(a, b, run_noise=flat).frame
            width = (pl.col("ratio_ci_high") / pl.col("ratio_ci_low")).log()
            wide = result.frame.with_columns(w=width)["w"].to_numpy()
            narrow = pooled.with_columns(w=width)["w"].to_numpy()
            assert (wide >= narrow - 1e-12).all() and (wide > narrow + 1e-6).any()
    assert warned >= pairs - 1  # 15% per loud cell is seen nearly every time
    assert false_alarms == 0


def test_below_the_level_nothing_changes(tmp_path: Path) -> None:
    for seed in range(3):
        result, a, b = _pair(tmp_path / str(seed), seed, loud=0.0)
        assert not _warnings(result)
        noise = result.run_noise
        pooled = analysis.compare_runs(a, b, run_noise=dataclasses.replace(noise, cells={}))
        assert not any(c.loud for c in noise.cells.values())
        assert pooled.frame.equals(result.frame)


def test_one_run_a_side_says_how_far_the_assumed_noise_holds(tmp_path: Path) -> None:
    a = analysis.load_run(write_run(tmp_path, with_changes(SPEC, noise_seed=1), run_id="a"))
    b = analysis.load_run(write_run(tmp_path, with_changes(SPEC, noise_seed=2), run_id="b"))
    result = analysis.compare_runs(a, b)
    assert result.run_noise is DEFAULT_RUN_NOISE
    text = result.to_text()
    assert f"at most {NOISE_LEVEL:.0%} per cell" in text and "cannot measure" in text
