"""The report says what a run's target was: SIMULATED wherever the replicas said so, with
modeled seconds only where their time scale is known; real targets get no simulated part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from sessiongen import analysis
from sessiongen.analysis.stats import Bootstrap
from sessiongen.report.document import Bullets, Heading, Paragraph
from sessiongen.report.frames import Frames
from sessiongen.report.plots import FIGURE_NAMES
from sessiongen.report.write import build_blocks
from tests.support.synthetic import SyntheticSpec, write_run

SPEC = SyntheticSpec(placements=("alternate",), sessions=5, turns=2, warmup=0)
BOOT = Bootstrap(n_resamples=200)


def run_folder(tmp_path: Path, target: dict[str, Any]) -> Path:
    """A synthetic run whose records carry the server's own TTFT (as the simulator's do),
    with the manifest's target replaced by ``target``."""
    spec = SyntheticSpec(**{**SPEC.__dict__, "time_scale": target["time_scale"]})
    run_dir = write_run(tmp_path, spec)
    requests = pl.read_parquet(run_dir / "requests.parquet")
    requests = requests.with_columns(server_ttft_s=pl.col("ttft_s") * 0.99)
    requests.write_parquet(run_dir / "requests.parquet")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["target"] = target
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


def report_text(run_dir: Path) -> str:
    run = analysis.load_run(run_dir)
    figures = {name: Path(f"{name}.png") for name in FIGURE_NAMES}
    blocks = build_blocks(run, Frames.compute(run, BOOT), figures, BOOT)
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading | Paragraph):
            lines.append(block.text)
        elif isinstance(block, Bullets):
            lines += block.items
    return "\n".join(lines)


def test_simulated_endpoints_are_labelled_and_read_in_modeled_seconds(tmp_path: Path) -> None:
    target = {
        "kind": "endpoints",
        "simulated": True,
        "time_scale": 0.1,
        "time_scale_known": True,
        "time_scale_from": "/version",
    }
    text = report_text(run_folder(tmp_path, target))
    assert "target SIMULATED (endpoints), time scale 0.1" in text
    assert "All durations are modeled seconds" in text
    assert "endpoints said they are simulated replicas (their /version), at time scale 0.1" in text
    assert "modeled seconds = measured / time scale (0.1, as the simulated replicas" in text
    assert "Measurement error (simulated target)" in text
    assert "measured seconds" not in text


def test_simulated_endpoints_without_a_time_scale_say_so(tmp_path: Path) -> None:
    target = {"kind": "endpoints", "simulated": True, "time_scale": 1.0, "time_scale_known": False}
    text = report_text(run_folder(tmp_path, target))
    assert "SIMULATED (endpoints)" in text and "All durations are measured seconds" in text
    assert "but not their time scale, so durations are left in measured wall seconds" in text
    assert "Durations: measured wall seconds" in text and "modeled seconds =" not in text


def test_real_endpoints_never_get_a_simulated_section(tmp_path: Path) -> None:
    target = {"kind": "endpoints", "simulated": False, "time_scale": 1.0}
    run_dir = run_folder(tmp_path, target)
    assert analysis.measurement_error(analysis.load_run(run_dir)).is_empty()
    text = report_text(run_dir)
    assert "All durations are measured seconds" in text
    assert "Durations: measured wall seconds, as the client timed them." in text
    assert "simulat" not in text.lower() and "modeled" not in text.lower()
