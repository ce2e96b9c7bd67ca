"""The nightly job: config validation, the suite loop with a stand-in replay, and the real
simulated pair over six nights with a planted slowdown."""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from sessiongen import replay, trend
from sessiongen.cli import cli
from sessiongen.errors import EndpointError, ScenarioError
from sessiongen.scenario import schema
from sessiongen.scenario.spec import Scenario
from sessiongen.trend import nightly
from tests.support.paths import ROOT
from tests.support.synthetic import SyntheticSpec, write_run
from tests.support.trend_history import Night, write_history

SMOKE = ROOT / "scenarios/smoke.toml"


def write_config(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nightly.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def suite_error(tmp_path: Path, body: str) -> str:
    path = write_config(tmp_path, body)
    with pytest.raises(ScenarioError) as info:
        nightly.load_suite(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


# --- config ------------------------------------------------------------------------------


def test_example_config_is_valid() -> None:
    suite = nightly.load_suite(ROOT / "nightly/example.toml")
    assert [s.name for s in suite.scenarios] == ["alt32k", "xreplica"]
    # Each scenario keeps its own time scale (0.1 made 13 of 20 cells err by over 2%).
    assert [s.target.sim.time_scale for s in suite.scenarios] == [0.15, 0.1]
    assert suite.scenarios[1].sessions.initial_context_tokens == (8192, 32768)
    assert suite.config.check.thresholds.speedup == 0.08


def test_target_is_merged_and_set_overrides_it(tmp_path: Path) -> None:
    folder = tmp_path / "suite"
    relative = os.path.relpath(SMOKE, folder)
    path = write_config(
        folder,
        f"""
        [target.sim]
        time_scale = 0.07
        slowdown = 1.5

        [[scenario]]
        file = "{relative}"
        set = ["target.sim.slowdown=1.25", "sessions.count=3"]

        [[scenario]]
        file = "{SMOKE}"
        """,
    )
    first, second = nightly.load_suite(path).scenarios
    assert (first.target.sim.time_scale, first.target.sim.slowdown) == (0.07, 1.25)
    assert first.sessions.count == 3
    assert second.target.sim.slowdown == 1.5 and second.sessions.count == 2


def test_scenario_files_are_relative_to_the_config(tmp_path: Path) -> None:
    body = '[[scenario]]\nfile = "scenarios/smoke.toml"\n'  # right from the repo root only
    message = suite_error(tmp_path, body)
    assert f"scenario[0]: {tmp_path / 'scenarios/smoke.toml'}: no such file" in message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("report = true\n", "scenario: missing; expected a list of tables"),
        ("scenario = []\n", "scenario: expected a non-empty list of tables, got []"),
        ("[[scenario]]\nset = []\n", "scenario[0].file: missing"),
        (
            f'[[scenario]]\nfile = "{SMOKE}"\n[check]\ntreshold = 0.1\n',
            "check.treshold: unknown key",
        ),
        (
            f'[[scenario]]\nfile = "{SMOKE}"\n[check.thresholds]\np99 = 0.1\n',
            "check.thresholds.p99: unknown key (known keys here: speedup, ttft)",
        ),
        (
            f'[[scenario]]\nfile = "{SMOKE}"\n[check]\nmin_nights = 0\n',
            "check.min_nights: expected",
        ),
        (
            f'[[scenario]]\nfile = "{SMOKE}"\n[target]\nkind = "cloud"\n',
            "target.kind: expected one of",
        ),
        (
            f'[[scenario]]\nfile = "{SMOKE}"\nset = ["sessions.count=zero"]\n',
            f"scenario[0]: {SMOKE}: sessions.count: expected an integer",
        ),
        ("[[scenario]\n", "not valid TOML"),
    ],
)
def test_config_errors_are_one_line_naming_file_and_key(
    tmp_path: Path, body: str, expected: str
) -> None:
    assert expected in suite_error(tmp_path, body)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"nope\.toml: no such file"):
        nightly.load_suite(tmp_path / "nope.toml")


def test_tables_become_overrides_that_parse_back() -> None:
    table = {
        "kind": "endpoints",
        "endpoints": ["http://a:1", 'q"x\\'],
        "sim": {"slowdown": 1.5, "on": True},
    }
    sets = nightly.table_overrides(table, "target")
    parsed = {".".join(keys): value for keys, value in map(schema.parse_override, sets)}
    assert parsed == {
        "target.kind": "endpoints",
        "target.endpoints": ["http://a:1", 'q"x\\'],
        "target.sim.slowdown": 1.5,
        "target.sim.on": True,
    }


# --- the suite loop, with a stand-in replay ----------------------------------------------

START = datetime(2026, 12, 1, 2, 0, 0, tzinfo=UTC)


class StandIn:
    """Writes a synthetic run per call instead of replaying, one night per :meth:`night`.

    Scenario names choose the outcome: ``down`` cannot connect, ``stop`` is interrupted,
    ``flaky`` has a failed request, ``tiny`` has 2 sessions (below the minimum); others
    are clean. ``target.sim.slowdown`` is planted.
    """

    def __init__(self) -> None:
        self.day = 0
        self.calls: list[str] = []

    def night(self) -> None:
        self.day += 1

    def __call__(self, sc: Scenario, opts: replay.ReplayOptions) -> replay.ReplayResult:
        self.calls.append(sc.name)
        if sc.name == "down":
            raise EndpointError("http://127.0.0.1:9: unreachable (ClientConnectorError)")
        spec = SyntheticSpec(
            name=sc.name,
            placements=("alternate",),
            sessions=2 if sc.name == "tiny" else 6,
            turns=2,
            slowdown=sc.target.sim.slowdown,
            started=START + timedelta(days=self.day),
            noise_seed=self.day,
            noise_sigma=0.03,
        )
        run_dir = write_run(opts.runs_dir, spec)
        failures = Counter({"timeout": 1} if sc.name == "flaky" else {})
        return replay.ReplayResult(
            run_dir, requests=48, failures=failures, interrupted=sc.name == "stop"
        )


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> StandIn:
    fake = StandIn()
    monkeypatch.setattr(nightly, "replay", fake)
    return fake


def suite(folder: Path, *names: str, slowdown: float = 1.0, plot: bool = False) -> Path:
    entries = "".join(f'[[scenario]]\nfile = "{SMOKE}"\nset = ["name={n}"]\n' for n in names)
    body = f"plot = {str(plot).lower()}\n[target.sim]\nslowdown = {slowdown}\n{entries}"
    return write_config(folder, body)


def test_nights_with_a_planted_slowdown(tmp_path: Path, stand_in: StandIn) -> None:
    store, runs = tmp_path / "store", tmp_path / "runs"
    results = []
    for day, slowdown in enumerate([1.0, 1.0, 1.0, 1.0, 1.3, 1.3]):
        config = suite(tmp_path / f"night{day}", "smoke", slowdown=slowdown, plot=day == 5)
        results.append(nightly.run_nightly(config, store, runs))
        stand_in.night()
    quiet, last = results[3], results[5]
    assert quiet.exit_code == 0 and quiet.check is not None and quiet.check.findings.is_empty()
    assert "OK" in quiet.summary.read_text().splitlines()[0]
    assert quiet.summary.read_text().splitlines()[0].endswith("UTC: OK")
    assert last.exit_code == 1 and last.check is not None
    started = {r["started_run"] for r in last.check.regressions.iter_rows(named=True)}
    assert started == {results[4].runs[0].run_dir.name}  # type: ignore[union-attr]
    text = last.summary.read_text()
    assert "ATTENTION" in text and "sim.slowdown: 1.0 -> 1.3" in text
    assert last.plots and all(p.is_file() for p in last.plots)
    assert f"({last.plots[0].relative_to(last.out_dir)})" in text
    assert len(list(store.glob("*/*.parquet"))) == 6 and last.added == list(
        store.glob(f"*/{results[5].runs[0].run_dir.name}.parquet")  # type: ignore[union-attr]
    )


def test_only_the_suites_scenarios_are_checked(tmp_path: Path, stand_in: StandIn) -> None:
    store = tmp_path / "store"
    write_history(store, [Night()] * 6 + [Night(ttft={("*", "*", "*"): 1.5})] * 2, name="retired")
    assert trend.trend_check(store).exit_code == 1
    result = nightly.run_nightly(suite(tmp_path, "smoke", plot=True), store, tmp_path / "runs")
    assert result.exit_code == 0 and result.check is not None
    assert [k.split("-")[0] for k in result.check.groups] == ["smoke"]
    assert all("retired" not in str(p) for p in result.plots)


def test_a_scenario_that_cannot_run_is_recorded_and_the_suite_goes_on(
    tmp_path: Path, stand_in: StandIn
) -> None:
    result = nightly.run_nightly(
        suite(tmp_path, "down", "smoke"), tmp_path / "store", tmp_path / "runs"
    )
    assert stand_in.calls == ["down", "smoke"]
    down, smoke = result.runs
    assert down.error is not None and "unreachable" in down.error and down.run_dir is None
    assert smoke.ok and smoke.stored is not None
    assert result.exit_code == 1  # a scenario that could not run needs a look
    assert "could not run: http://127.0.0.1:9: unreachable" in result.summary.read_text()


def test_failed_requests_make_the_night_fail_but_are_stored(
    tmp_path: Path, stand_in: StandIn
) -> None:
    result = nightly.run_nightly(suite(tmp_path, "flaky"), tmp_path / "store", tmp_path / "runs")
    [run] = result.runs
    assert run.failed == 1 and run.stored is not None and result.exit_code == 1
    assert run.failure is not None and run.failure.startswith("1 of 48 requests failed (1 timeout)")
    assert result.check is not None and result.check.findings.is_empty()  # one night only


def test_interrupt_stops_the_suite(tmp_path: Path, stand_in: StandIn) -> None:
    result = nightly.run_nightly(
        suite(tmp_path, "stop", "smoke"), tmp_path / "store", tmp_path / "runs"
    )
    assert stand_in.calls == ["stop"] and result.exit_code == 130
    assert result.runs[0].stored is None and result.check is None
    assert "INTERRUPTED" in result.summary.read_text()


def test_each_run_gets_its_report(
    tmp_path: Path, stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[Path] = []

    def write_report(run_dir: Path, **_: object) -> Path:
        written.append(run_dir)
        return run_dir / "report.md"

    monkeypatch.setattr("sessiongen.report.write_report", write_report)
    result = nightly.run_nightly(suite(tmp_path, "smoke"), tmp_path / "store", tmp_path / "runs")
    assert written == [result.runs[0].run_dir]
    assert result.runs[0].report == result.runs[0].run_dir / "report.md"  # type: ignore[operator]


# --- end to end on the simulated pair ----------------------------------------------------


@pytest.mark.slow
def test_simulated_pair_slowdown_raises_a_regression_and_steady_nights_do_not(
    tmp_path: Path,
) -> None:
    # Six nights of the smoke scenario on the real simulated pair (about 4 s each):
    # four at slowdown 1.0, then two at 1.3. Modeled time runs in real time (time scale
    # 1) so that a millisecond of lateness on a busy machine is a millisecond, not
    # tens: the smallest cell (turn 2 through the pool, 4k context) takes about 70 ms.
    # Two turns skip the local-hit turn; one session at a time keeps a session's turn 2
    # from queueing behind the other's turn 1.
    store, runs = tmp_path / "store", tmp_path / "runs"
    sets = [
        "sessions.count=2",
        "sessions.turns=2",
        "sessions.initial_context_tokens=4096",
        'design.blocks=["off","on"]',
        "design.warmup_requests=1",
        "target.sim.time_scale=1.0",
        "driver.concurrency=1",
    ]
    results = []
    for day, slowdown in enumerate([1.0, 1.0, 1.0, 1.0, 1.3, 1.3]):
        overrides = json.dumps([*sets, f"target.sim.slowdown={slowdown}"])
        entry = f'[[scenario]]\nfile = "{SMOKE}"\nset = {overrides}\n'
        config = write_config(
            tmp_path / f"night{day}", f"report = false\nplot = {str(day == 5).lower()}\n{entry}"
        )
        results.append(nightly.run_nightly(config, store, runs))
        assert results[-1].runs[0].ok, results[-1].runs[0]
    for quiet in results[:4]:
        assert quiet.exit_code == 0, quiet.check.table() if quiet.check else quiet
    last = results[5]
    assert last.exit_code == 1 and last.check is not None
    regressions = last.check.regressions
    assert regressions.height >= 1, last.check.table()
    assert set(regressions["started_run"]) == {results[4].runs[0].run_dir.name}  # type: ignore[union-attr]
    assert set(regressions["versions_changed"]) == {"sim.slowdown: 1.0 -> 1.3"}
    assert set(regressions["metric"]) == {"ttft"}
    assert (regressions["change"] > 0.15).all()
    assert last.plots


def test_the_summary_carries_the_runs_problems_and_limits(
    tmp_path: Path, stand_in: StandIn
) -> None:
    # The summary was headed "OK" over runs whose reports said not to trust them.
    result = nightly.run_nightly(suite(tmp_path, "tiny", "smoke"), tmp_path / "s", tmp_path / "r")
    tiny = result.runs[0]
    assert tiny.limits and not result.runs[1].limits and result.exit_code == 0
    text = result.summary.read_text()
    assert text.splitlines()[0].endswith("UTC: OK, WITH LIMITS in 1 of 2 runs")
    assert "## Problems and limits of tonight's runs" in text and "### tiny" in text
    assert f"- Limit: {tiny.limits[0]}" in text and "Only 2 sessions per arm" in text


def test_the_night_says_each_step_and_lists_limits_before_problems(
    tmp_path: Path, stand_in: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """The nightly was silent for minutes by default, and its summary
    listed a run's Problems before its Limits, the other way round from the report."""
    config = suite(tmp_path, "tiny", "down")
    result = CliRunner().invoke(
        cli, ["nightly", str(config), "--store", str(tmp_path / "s"), "--runs-dir", str(tmp_path)]
    )
    steps = [line for line in result.stderr.splitlines() if line.startswith("nightly: ")]
    assert steps[0] == f"nightly: [1/2] tiny: replaying {SMOKE}"
    done = r"nightly: \[1/2\] tiny: 48 requests, \d+ limits?, 0 problems; report "
    assert re.match(done, steps[1]), steps[1]
    assert steps[3].startswith("nightly: [2/2] down: could not run: http://127.0.0.1:9")
    assert steps[-1] == f"nightly: checking the trend in {tmp_path / 's'}"
    night = nightly.NightlyResult(tmp_path, tmp_path / "s.md", [], [], None, [])
    night.runs.append(nightly.NightlyRun("x", "x.toml", folder="x", problems=("P",), limits=("L",)))
    lines = nightly._cautions(night)  # the report's order: Limits, then Problems
    assert lines.index("- Limit: L") < lines.index("- Problem: P")
