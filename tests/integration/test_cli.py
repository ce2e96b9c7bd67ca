"""The command line through click's runner and as a real process (exit codes, one-line errors)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
from click.testing import CliRunner

from sessiongen import __version__
from sessiongen.cli import cli
from tests.support.fakeserver import ThreadServer, make_app
from tests.support.paths import ROOT


def test_version_and_help() -> None:
    runner = CliRunner()
    assert __version__ in runner.invoke(cli, ["--version"]).output
    for cmd in (["--help"], ["generate", "--help"], ["replay", "--help"]):
        result = runner.invoke(cli, cmd)
        assert result.exit_code == 0 and "Usage:" in result.output


def test_generate_writes_exact_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "smoke.jsonl"
    result = CliRunner().invoke(
        cli,
        [
            "generate",
            str(ROOT / "scenarios/smoke.toml"),
            "-o",
            str(out),
            "--set",
            "sessions.count=3",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 * 3
    assert [r["turn"] for r in rows[:3]] == [1, 2, 3]
    assert set(rows[0]) == {
        "session_id",
        "turn",
        "context_tokens",
        "content_tokens",
        "expected",
        "body",
    }
    first, second = rows[0]["body"]["messages"], rows[1]["body"]["messages"]
    assert second[: len(first)] == first
    assert rows[0]["expected"] is not None


def test_bad_override_is_one_line_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "generate",
            str(ROOT / "scenarios/smoke.toml"),
            "-o",
            str(tmp_path / "x"),
            "--set",
            "sessions.turns=six",
        ],
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    expected = 'sessions.turns: expected an integer >= 1 and <= 1000, got "six"'
    assert lines == [f"sessiongen: error: {ROOT / 'scenarios/smoke.toml'}: {expected}"]


def test_bad_scenario_file_from_a_real_process(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[sessions]\nturns = "six"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "sessiongen", "replay", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    expected = 'sessions.turns: expected an integer >= 1 and <= 1000, got "six"'
    assert proc.stderr.strip() == f"sessiongen: error: {bad}: {expected}"
    assert "Traceback" not in proc.stderr


def test_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "replay",
            str(ROOT / "scenarios/smoke.toml"),
            "--endpoints",
            "http://127.0.0.1:9",
            "--cache",
            "on",
            "--runs-dir",
            str(tmp_path),
            "--no-progress",
        ],
    )
    assert result.exit_code == 2
    assert "unreachable" in result.output and len(result.output.strip().splitlines()) == 1


def test_failed_requests_exit_1_and_keep_records(tmp_path: Path) -> None:
    with ThreadServer(make_app("http500")) as server:
        result = CliRunner().invoke(
            cli,
            [
                "replay",
                str(ROOT / "scenarios/smoke.toml"),
                "--endpoints",
                server.url,
                "--cache",
                "off",
                "--runs-dir",
                str(tmp_path),
                "--no-progress",
                "--no-report",
            ],
        )
    assert result.exit_code == 1
    assert "requests failed (4 http_error)" in result.output
    (run_dir,) = tmp_path.iterdir()
    assert pl.read_parquet(run_dir / "requests.parquet").filter(~pl.col("warmup")).height == 4


def test_ctrl_c_stops_cleanly_and_keeps_what_was_measured(tmp_path: Path) -> None:
    with ThreadServer(make_app("ok", delay_s=0.15)) as server:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sessiongen",
                "replay",
                str(ROOT / "scenarios/smoke.toml"),
                "--endpoints",
                server.url,
                "--cache",
                "on",
                "--runs-dir",
                str(tmp_path),
                "--no-progress",
                "--no-report",
                "--set",
                "sessions.count=20",
                "--set",
                "driver.concurrency=1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 60
        parquet = None
        while time.monotonic() < deadline:
            runs = list(tmp_path.iterdir())
            if runs and (runs[0] / "requests.parquet").exists():
                parquet = runs[0] / "requests.parquet"
                break
            time.sleep(0.1)
        assert parquet is not None, "replay never wrote records"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    manifest = json.loads((parquet.parent / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["blocks"][-1]["status"] == "interrupted"
    rows = pl.read_parquet(parquet)
    assert rows.height >= 5  # everything measured before the interrupt is kept
