"""The loaded terms (decode batching, whether pool loads hold the step) fitted by planning
the loaded probe: known values come back from the simulator's own engine, through noise,
and runs that cannot tell them say so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.capacity import fit, loaded
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.cli import main
from sessiongen.records.io import atomic_write_parquet
from tests.support.paths import ROOT

#: The simulator's own profile, with a store cost the alone probe's two arms tell apart.
BASE = ["target.kind=sim", "target.sim.pool_store_s_per_gb=1.0"]
#: The loaded probe, smaller: one context size, 4 sessions (2 per replica at level 4).
SMALL = ["sessions.initial_context_tokens=[4096]", "sessions.count=4", "load.levels=[4]"]
ITL_BASE = 0.012  # the default profile's itl_base_s


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The alone probe, planned: every per-request term exact, up to 4096 tokens."""
    sc = scenario.load(
        ROOT / "scenarios" / "fitprobe.toml",
        [*BASE, "sessions.count=2", "sessions.initial_context_tokens=[1024, 2048, 4096]"],
    )
    return virtual_replay(sc, tmp_path_factory.mktemp("probe"))


def loaded_run(root: Path, *sets: str) -> Path:
    sc = scenario.load(ROOT / "scenarios" / "fitprobe-load.toml", [*BASE, *SMALL, *sets])
    return virtual_replay(sc, root)


@pytest.mark.parametrize(("mode", "multiple"), [("async", 0.5), ("sync", 0.2)])
def test_the_loaded_terms_of_the_engine_come_back(
    probe: Path, tmp_path: Path, mode: str, multiple: float
) -> None:
    batch = multiple * ITL_BASE
    run = loaded_run(
        tmp_path, f"target.sim.pool_load_mode={mode}", f"target.sim.itl_per_batch_s={batch}"
    )
    result = fit.fit_runs([probe, run], resamples=100)
    terms = result.loaded
    assert terms is not None
    assert terms.pool_load_mode == mode and terms.mode_share >= loaded.MODE_SHARE
    assert terms.itl_per_batch_s == pytest.approx(batch)
    assert terms.batch_low <= batch * (1 + 1e-9) and batch <= terms.batch_high * (1 + 1e-9)
    assert not {"itl_per_batch_s", "pool_load_mode"} & set(result.not_identified)
    # The other mode at its best reproduces the run worse than the truth does.
    losses = terms.losses.group_by("pool_load_mode").agg(pl.col("loss").min())
    best = dict(zip(losses["pool_load_mode"], losses["loss"], strict=True))
    other = "sync" if mode == "async" else "async"
    assert best[other] > 1.5 * best[mode], best
    profile = result.profile()
    assert profile["pool_load_mode"] == mode and profile["itl_per_batch_s"] == terms.itl_per_batch_s
    text = fit.summary_text(result)
    assert f"best in {terms.mode_share:.0%} of resamples" in text


def test_noisy_loaded_runs_still_tell_the_mode_and_hold_the_batching_cost(
    probe: Path, tmp_path: Path
) -> None:
    """Every TTFT and decode time off by 10% (lognormal, seeded): the mode still wins in
    the resamples and the batching cost's interval holds the truth."""
    batch = 0.5 * ITL_BASE
    run = loaded_run(
        tmp_path, "target.sim.pool_load_mode=async", f"target.sim.itl_per_batch_s={batch}"
    )
    path = run / "requests.parquet"
    rows = pl.read_parquet(path)
    rng = np.random.default_rng(3)
    a, b = (pl.Series(np.exp(0.1 * rng.standard_normal(rows.height))) for _ in range(2))
    decode = (pl.col("e2e_s") - pl.col("ttft_s")) * b
    rows = rows.with_columns(ttft_s=pl.col("ttft_s") * a).with_columns(
        e2e_s=pl.col("ttft_s") + decode
    )
    atomic_write_parquet(path, rows)
    terms = fit.fit_runs([probe, run], resamples=100).loaded
    assert terms is not None and terms.pool_load_mode == "async", terms
    assert terms.batch_low <= batch * (1 + 1e-9) and batch <= terms.batch_high * (1 + 1e-9)
    assert terms.batch_high < loaded.BATCH_MULTIPLES[-1] * ITL_BASE  # it is identified


def test_runs_without_pool_loads_under_load_do_not_identify_the_mode(
    probe: Path, tmp_path: Path
) -> None:
    """The pool-off arm alone: no request loads from the pool, so both modes plan the
    same run: the mode is not identified (a tie is no win), the batching cost still is."""
    run = loaded_run(tmp_path, 'design.cache=["off"]', 'design.blocks=["off"]')
    result = fit.fit_runs([probe, run], resamples=100)
    terms = result.loaded
    assert terms is not None and terms.mode_share == 0.0
    assert "pool_load_mode" in result.not_identified
    assert "itl_per_batch_s" not in result.not_identified
    assert "not identified by these runs" in fit.summary_text(result)


def test_the_cli_fits_both_probes_into_one_profile_a_scenario_loads(
    probe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = loaded_run(tmp_path, "target.sim.pool_load_mode=async")
    out = tmp_path / "fitted.toml"
    main(["fit", str(probe), str(run), "-o", str(out), "--resamples", "1000"])
    printed = capsys.readouterr().out
    assert "loaded terms, from" in printed and "pool_load_mode" in printed
    sc = scenario.load(
        ROOT / "scenarios" / "load128k.toml", ["target.kind=sim", f"target.sim.profile={out}"]
    )
    assert sc.target.sim.pool_load_mode == "async"
    assert sc.target.sim.pool_store_s_per_gb == pytest.approx(1.0)


def test_a_fit_without_a_loaded_run_says_the_loaded_terms_are_defaults(probe: Path) -> None:
    result = fit.fit_runs([probe], resamples=100)
    assert result.loaded is None and "itl_per_batch_s" not in result.profile()
    assert "loaded terms (itl_per_batch_s, pool_load_mode): not fitted" in fit.summary_text(result)


def test_each_draw_carries_its_resamples_best_loaded_terms(probe: Path, tmp_path: Path) -> None:
    """Joint draws: draw i's batching cost and mode are resample i's best candidate (the
    first of ties), and the profile's [fit.interval] holds the batching cost's."""
    import tomllib

    batch = 0.5 * ITL_BASE
    run = loaded_run(
        tmp_path, "target.sim.pool_load_mode=async", f"target.sim.itl_per_batch_s={batch}"
    )
    result = fit.fit_runs([probe, run], resamples=100)
    terms = result.loaded
    assert terms is not None and len(terms.choices) == loaded.RESAMPLES
    draws = result.draws()
    assert len(draws) == 100
    for i, draw in enumerate(draws):
        assert (draw["pool_load_mode"], draw["itl_per_batch_s"]) == terms.choices[i]
    text = fit.write_profile(result, tmp_path / "p.toml").read_text()
    written = tomllib.loads(text)["fit"]
    assert written["interval"]["itl_per_batch_s"] == [terms.batch_low, terms.batch_high]
    assert [d["itl_per_batch_s"] for d in written["draw"]] == [c[1] for c in terms.choices[:100]]
