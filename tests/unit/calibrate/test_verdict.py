"""What ``calibrate`` answers: the verdict first, then figures whose tails carry their
sample counts (early-stopping estimates: 64 requests for a p90, 662 for a p99)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sessiongen.analysis.tails import tail
from sessiongen.calibrate import measure
from sessiongen.calibrate.verdict import figure_lines, tail_text, verdict
from sessiongen.cli import cli
from sessiongen.records.run import load_run
from sessiongen.report.describe import overhead_section
from sessiongen.report.document import Bullets, Heading, Paragraph
from tests.support.synthetic import SyntheticSpec, write_run


def figures(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "concurrency": 64,
        "body_bytes": 512 * 1024,
        "server_delay_ms": 50.0,
        "steady_duration_s": 5.0,
        "burst_rounds": 3,
        "requests": 1280,
        "failed": 0,
        "requests_own": 1200,
        "added_ttft_p50_ms": 0.4,
        "added_ttft_p90_ms": 0.8,
        "added_ttft_p99_ms": 1.3,
        "added_ttft_max_ms": 4.1,
        "added_ttft_p99_own_ms": 1.1,
        "added_ttft_max_own_ms": 2.0,
        "upstream_p50_ms": 0.1,
        "upstream_p99_ms": 0.3,
        "upstream_max_ms": 0.5,
        "downstream_p50_ms": 0.3,
        "downstream_p99_ms": 1.0,
        "downstream_max_ms": 3.9,
        "lag_flagged": 3,
        "lag_max_ms": 3.2,
        "lag_stalls": 12,
        "lag_preempted": 4,
        "burst_requests": 192,
        "burst_failed": 0,
        "burst_added_ttft_p50_ms": 0.9,
        "burst_added_ttft_p90_ms": 2.5,
        "burst_added_ttft_p99_ms": None,
        "burst_added_ttft_max_ms": 9.1,
        "stream_streams": 32,
        "stream_chunks_per_cpu_s": 41000.0,
        "stream_chunks_per_read": 1.02,
        "stream_chunks_per_s": 38000.0,
    }
    return {**base, **changes}


def test_the_verdict_names_the_p99_and_the_ttfts_it_is_small_beside() -> None:
    assert verdict(figures()) == (
        "the client adds 0.40 ms at p50 and at most 1.3 ms at p99 (1280 requests) at this "
        "load (64 streams, 512 KiB bodies): fine for TTFTs above 130 ms at the 1% level and "
        "above 65 ms at the 2% level"
    )


def test_without_a_p99_the_verdict_states_the_p90_and_how_to_get_a_p99() -> None:
    fig = figures(requests=200, added_ttft_p99_ms=None, added_ttft_p90_ms=0.9)
    text = verdict(fig)
    assert "at most 0.90 ms at p90 (200 requests)" in text
    assert "above 90 ms at the 1% level and above 45 ms at the 2% level" in text
    # 200 requests in 5 s: 662 need 16.6 s, and 10% for the first cycle.
    assert text.endswith("a p99 needs 662 requests (sessiongen calibrate --duration 19)")


def test_too_few_requests_for_any_tail_say_so_and_never_call_the_maximum_a_p99() -> None:
    fig = figures(requests=20, added_ttft_p90_ms=None, added_ttft_p99_ms=None)
    text = verdict(fig)
    assert "0.40 ms at p50 (20 requests: too few for a tail, a p90 needs 64)" in text
    assert "p99" not in text.split(";")[0] and "--duration 18" in text
    lines = "\n".join(figure_lines(fig))
    assert "p90 n/a (20 of 64 needed; max 4.1 ms), p99 n/a (20 of 662 needed; max 4.1 ms)" in lines
    assert verdict(figures(requests=0, failed=7)).startswith("no verdict: no request was measured")


def test_every_tail_in_the_figures_carries_its_sample_count() -> None:
    lines = figure_lines(figures())
    assert lines[0].startswith("steady state: 64 closed-loop streams for 5 s, 1280 requests")
    assert (
        lines[1]
        == "  added TTFT: p50 0.40 ms, p90 0.80 ms (n=1280), p99 1.3 ms (n=1280), max 4.1 ms"
    )
    assert "p99 1.1 ms (n=1200)" in lines[2]  # the client's own tail, over its own count
    burst = next(line for line in lines if line.startswith("  added TTFT: p50 0.90"))
    assert "p90 2.5 ms (n=192), p99 n/a (192 of 662 needed; max 9.1 ms)" in burst
    assert any("3 of 1280 requests lag-flagged (stalls over 2% of their TTFT)" in x for x in lines)
    assert tail_text(None, 0, 0.99, None) == "-"


def test_measured_tails_are_early_stopping_estimates_or_none() -> None:
    few = [float(i) for i in range(600)]
    assert measure.tail_ms(few, 0.99) is None and measure.tail_ms(few, 0.90) is not None
    many = [float(i) for i in range(2000)]
    assert measure.tail_ms(many, 0.99) == tail(many, 0.99).bound >= measure.percentile(many, 99)


def test_calibrate_prints_the_verdict_first_then_grouped_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[int, int, float]] = []
    few = figures(requests=20, added_ttft_p90_ms=None, added_ttft_p99_ms=None)

    def fake(concurrency: int, body_bytes: int, *, duration_s: float) -> dict[str, Any]:
        asked.append((concurrency, body_bytes, duration_s))
        return {**few, "verdict": verdict(few)}  # what measure.calibrate returns, measured

    monkeypatch.setattr(measure, "calibrate", fake)
    args = ["calibrate", "--concurrency", "2", "--body-kb", "16", "--duration", "0.5"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert asked == [(2, 16 * 1024, 0.5)]
    lines = [x for x in result.output.splitlines() if not x.startswith("calibrating at")]
    assert lines[0] == f"verdict: {verdict(few)}"
    assert lines[1].startswith("(Fine above T at the 1% level:")
    assert lines[2:] == figure_lines(few)
    assert not any("_ms" in x or "_s:" in x for x in lines)  # no raw key: value lines


def test_the_report_shows_a_runs_calibration_as_calibrate_prints_it(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, SyntheticSpec(placements=("alternate",), turns=2))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["calibration"] = {**figures(), "verdict": verdict(figures())}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    shown = overhead_section(load_run(run_dir))
    assert shown[0] == Heading("Client overhead (calibration)")
    assert shown[1] == Paragraph(f"Verdict: {verdict(figures())}.")
    assert shown[3] == Bullets(tuple(figure_lines(figures())))
