"""Bad input to the designs for one's own replicas: one line naming the flag or field,
exit status 2, nothing sent and no run folder (see also test_bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessiongen.cli import main
from tests.support.paths import FIXTURES, ROOT

SMOKE = str(ROOT / "scenarios" / "smoke.toml")
RUN = str(sorted((FIXTURES / "v1" / "runs").iterdir())[-1])
A, B, C = "http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"

CASES: dict[str, tuple[list[str], str]] = {
    "an OFF pair without an ON pair": (
        ["--endpoints-off", f"{A},{B}"],
        "target.endpoints_on: expected URLs too when endpoints_off is given",
    ),
    "pairs of different sizes": (
        ["--endpoints-off", f"{A},{B}", "--endpoints-on", C],
        "target.endpoints_on: expected as many replicas as endpoints_off (2), got 1",
    ),
    "pairs and a stated arm": (
        ["--endpoints-off", A, "--endpoints-on", B, "--cache", "on"],
        "--cache: not with --endpoints-off/--endpoints-on (each pair is one arm)",
    ),
    "pairs and one set of endpoints": (
        ["--endpoints-off", A, "--endpoints-on", B, "--endpoints", C],
        "--endpoints: not with --endpoints-off/--endpoints-on",
    ),
    "pairs and a gateway": (
        ["--endpoints-off", A, "--endpoints-on", B, "--gateway", C],
        "target.gateway: not with endpoints_off/endpoints_on",
    ),
    "an ON pair that names none": (
        ["--endpoints-off", A, "--endpoints-on", ","],
        "--endpoints-on",
    ),
    "a switch command without {arm}": (
        ["--endpoints", A, "--switch-command", "restart-replicas"],
        "--switch-command: target.switch_command: expected a command with {arm} in it",
    ),
    "a switch command without the pair it switches": (
        ["--switch-command", "restart {arm}"],
        "--switch-command: give the pair it switches with --endpoints",
    ),
    "a switch command and a stated arm": (
        ["--endpoints", A, "--switch-command", "restart {arm}", "--cache", "on"],
        "--cache: not with --switch-command",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arms_are_one_line_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, expected = CASES[case]
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as stop:
        main(["replay", SMOKE, "--runs-dir", str(runs), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sessiongen: error: "), err
    assert expected in lines[0], lines[0]
    assert not runs.exists()


def test_a_merge_of_one_run_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["merge", RUN])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.strip() == "sessiongen: error: merge: expected two or more run folders (one per arm)"


def test_a_sim_switch_that_cannot_reach_the_replicas_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["sim", "switch", "--shared-cache", "on", A])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"sessiongen: error: POST {A}/sim/config: unreachable")
