"""``sessiongen fit --heldout``: held-out replays planned with the fitted profile give the
model's own error per regime, written into the profile as ``[fit.model_error]``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sessiongen import scenario
from sessiongen.capacity import fit
from sessiongen.capacity.virtual import virtual_replay
from sessiongen.cli import main
from sessiongen.errors import UserError
from tests.support.paths import ROOT

#: The simulator's own profile, with a store cost the probe's two arms tell apart.
BASE = ["target.kind=sim", "target.sim.pool_store_s_per_gb=1.0"]
#: The decision scenario, small: 3k contexts, 1 and 2 in flight, 6 sessions; its
#: "measurement" has service-time noise, so its intervals have width.
HELDOUT = [
    *BASE,
    "sessions.initial_context_tokens=[3000]",
    "load.levels=[1, 2]",
    "target.sim.prefill_noise_sigma=0.03",
]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sc = scenario.load(
        ROOT / "scenarios" / "fitprobe.toml",
        [*BASE, "sessions.count=2", "sessions.initial_context_tokens=[1024, 2048, 4096]"],
    )
    return virtual_replay(sc, tmp_path_factory.mktemp("probe"))


def heldout_run(root: Path, *sets: str) -> Path:
    sc = scenario.load(ROOT / "scenarios" / "decision-cpu.toml", [*HELDOUT, *sets])
    return virtual_replay(sc, root)


def test_held_out_runs_give_the_model_error_per_regime(probe: Path, tmp_path: Path) -> None:
    """At one session in flight the held-out run is the fitted engine's own, noise aside:
    an error within its measured noise (floored to 0 or near it). The same run with pool
    loads 0.3 s dearer than the probe's plans the alternate cell's gain a third too high:
    a model error of that size. (Under load the planned gain turns on who queues behind
    whom, so only its presence is checked here.)"""
    same = heldout_run(tmp_path / "same")
    base = fit.fit_runs([probe], resamples=1000)
    result = fit.with_model_error(base, [same], replicates=3)
    error = result.model_error
    assert error is not None
    assert (error["cells_one_in_flight"], error["cells_loaded"]) == (2, 2)  # 2 placements
    assert same.name in error["source"]
    assert error["one_in_flight"] < 0.05 and error["loaded"] >= 0.0
    dear = heldout_run(tmp_path / "dear", "target.sim.pool_load_fixed_s=0.3")
    worse = fit.with_model_error(base, [dear], replicates=3).model_error
    assert worse is not None and worse["one_in_flight"] > 0.15
    # Written as [fit.model_error], with its source command naming the held-out run.
    written = tomllib.loads(fit.profile_toml(result))["fit"]
    assert written["model_error"] == error
    assert written["source"] == f"sessiongen fit {probe.name} --heldout {same.name}"


def test_the_cli_takes_held_out_runs_and_refuses_bad_ones(
    probe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = heldout_run(tmp_path / "same")
    out = tmp_path / "fitted.toml"
    main(["fit", str(probe), "--heldout", str(same), "-o", str(out), "--resamples", "1000"])
    assert "model error (log-scale SD" in capsys.readouterr().out
    table = tomllib.loads(out.read_text())["fit"]["model_error"]
    assert set(table) == {
        "one_in_flight", "loaded", "cells_one_in_flight", "cells_loaded", "source"
    }  # fmt: skip
    with pytest.raises(UserError, match="also a run to fit"):
        fit.fit_runs([probe], resamples=1000, heldout=[probe])
    one_arm = heldout_run(tmp_path / "one", 'design.cache=["on"]', 'design.blocks=["on"]')
    with pytest.raises(UserError, match="both cache arms"):
        fit.fit_runs([probe], resamples=1000, heldout=[one_arm])
