"""Correctness end to end: real replays, the CLI's verdict lines and exit status.

Against the simulated pair (restarted per block, so every block replays the same
prompts; or kept running, so every block has its own salt), the simulated pair served
by ``sim serve`` in a child process and reached as endpoints (the reported reproduction),
and a deterministic fake server (its answer a hash of the prompt). A planted pool fault
(``target.sim.pool_corruption = 1.0``) must be caught and exit 1; a clean deterministic
server must show zero cache failures under every block design and exit 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sessiongen import analysis
from sessiongen.analysis.correctness import CACHE_FAILURE, NOT_EXERCISED, PASSED
from sessiongen.cli import cli
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import SimHandle, start_sim
from tests.support.fakeserver import ThreadServer, make_app
from tests.support.paths import ROOT

SMOKE = str(ROOT / "scenarios/smoke.toml")
EQUIVALENCE = ["sessions.probe=equivalence", "target.sim.time_scale=0.1"]
DESIGNS = {
    "on-on": ['design.blocks=["on","on"]', 'design.cache=["on"]'],
    "off-on": ['design.blocks=["off","on"]'],
    "off-on-on-off": [],
}
#: A planted fault: every answer the pool serves is corrupted (one OFF and one ON block).
FAULT = ["driver.concurrency=1", "target.sim.pool_corruption=1.0", *DESIGNS["off-on"]]


def replay(tmp_path: Path, *sets: str, endpoints: list[str] | None = None) -> Result:
    """``sessiongen replay smoke.toml`` through click's runner, no progress, no report."""
    # Correctness is about answers, not time: the simulator runs 20x faster than modeled.
    args = ["replay", SMOKE, "--runs-dir", str(tmp_path), "--no-progress", "--no-report"]
    args += ["--set", "target.sim.time_scale=0.05"]
    if endpoints:
        args += ["--endpoints", ",".join(endpoints), "--cache", "on"]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(cli, args)


def verdicts(tmp_path: Path) -> analysis.Correctness:
    [run_dir] = [p for p in tmp_path.iterdir() if (p / "manifest.json").exists()]
    return analysis.correctness(analysis.load_run(run_dir))


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("sessiongen: error")]


# --- the simulated pair --------------------------------------------------------------------


def test_sim_pair_planted_pool_fault_is_a_cache_failure_and_exits_1(tmp_path: Path) -> None:
    result = replay(tmp_path, *EQUIVALENCE, *FAULT)
    assert result.exit_code == 1, result.output
    [line] = error_lines(result)
    assert line.startswith("sessiongen: error: cache failures: ")
    assert "pool-served answers differ from OFF, against 0 of" in line
    eq = verdicts(tmp_path).equivalence
    assert eq.verdict == CACHE_FAILURE and eq.failures > 0 and eq.off_inconsistent == 0
    assert eq.ids_differ == eq.failures  # the planted fault changes token ids


def test_sim_pair_planted_pool_fault_misses_needles_and_exits_1(tmp_path: Path) -> None:
    result = replay(tmp_path, "target.sim.time_scale=0.1", *FAULT)
    assert result.exit_code == 1, result.output
    [line] = error_lines(result)
    assert "needle answers wrong in the ON arm where the OFF arm answered" in line
    n = verdicts(tmp_path).needles
    assert n.verdict == CACHE_FAILURE and n.failures > 0 and n.off_wrong == 0


@pytest.mark.parametrize("design", list(DESIGNS))
def test_sim_pair_clean_runs_never_diverge(tmp_path: Path, design: str) -> None:
    result = replay(tmp_path, *EQUIVALENCE, "driver.concurrency=1", *DESIGNS[design])
    assert result.exit_code == 0, result.output
    eq = verdicts(tmp_path).equivalence
    assert (eq.failures, eq.off_inconsistent, eq.on_only) == (0, 0, 0)
    if design == "on-on":  # no OFF answer to vouch for ON
        assert eq.verdict == NOT_EXERCISED
        assert "correctness: equivalence not exercised" in result.output
    else:  # the pool served turn 2 of every session in every ON block
        assert eq.verdict == PASSED and eq.exercised >= 2 and eq.evidence == "request"
        assert "correctness: equivalence passed" in result.output


def test_sim_pair_kept_running_gives_blocks_their_own_salts(tmp_path: Path) -> None:
    result = replay(tmp_path, *EQUIVALENCE, "design.restart_between_blocks=false")
    assert result.exit_code == 0, result.output
    eq = verdicts(tmp_path).equivalence
    assert (eq.compared, eq.failures, eq.on_only, eq.verdict) == (0, 0, 0, NOT_EXERCISED)


# --- endpoints -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_serve() -> Iterator[SimHandle]:
    """``sessiongen sim serve`` in a child process: the simulated pair as endpoints."""
    handle = start_sim(SimProfile(time_scale=0.05), "sim-27b", shared_cache=True)
    with handle:
        yield handle


@pytest.mark.parametrize("design", list(DESIGNS))
def test_sim_serve_endpoints_never_diverge(
    tmp_path: Path, sim_serve: SimHandle, design: str
) -> None:
    # The reported reproduction: blocks [on, on] reported 6 of 6 diverged and exited 0.
    sets = ["sessions.probe=equivalence", *DESIGNS[design]]
    result = replay(tmp_path, *sets, endpoints=list(sim_serve.urls))
    assert result.exit_code == 0, result.output
    c = verdicts(tmp_path)
    eq = c.equivalence
    assert (eq.failures, eq.on_only, eq.off_inconsistent, eq.verdict) == (0, 0, 0, NOT_EXERCISED)
    assert eq.prompts == eq.no_reference > 0  # every block its own salt: nothing repeats
    assert c.failure_line() is None


@pytest.mark.parametrize("design", list(DESIGNS))
def test_deterministic_server_endpoints_never_diverge(tmp_path: Path, design: str) -> None:
    with (
        ThreadServer(make_app("ok", deterministic=True)) as a,
        ThreadServer(make_app("ok", deterministic=True)) as b,
    ):
        result = replay(
            tmp_path, "sessions.probe=equivalence", *DESIGNS[design], endpoints=[a.url, b.url]
        )
    assert result.exit_code == 0, result.output
    run = analysis.load_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
    eq = analysis.equivalence(run)
    assert eq.distinct_outputs == eq.prompts > 1 and not eq.vacuous
    assert (eq.failures, eq.on_only, eq.verdict) == (0, 0, NOT_EXERCISED)
    assert analysis.run_summary(run)["divergences"].sum() == 0
