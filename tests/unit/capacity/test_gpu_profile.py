"""The GPU profile against the H100 run it was fitted on (bench/gpu/2026-12-07): the fit
stands on mended local hits, and the shipped file says what it was fitted on."""

from __future__ import annotations

import tomllib

import pytest

from sessiongen.capacity import fit
from sessiongen.capacity.fitdata import kv_bytes_from
from sessiongen.launch.tinymodel import LLAMA_8B, kv_bytes_per_token
from sessiongen.records.io import read_meta
from sessiongen.scenario.spec import PROFILES_DIR
from tests.support.paths import ROOT

RUNS = ROOT / "bench" / "gpu" / "2026-12-07" / "runs"
PROBE = RUNS / "20261207T091036Z-fitprobe-ef22"


def test_the_probe_run_tells_the_8b_models_kv_size() -> None:
    assert kv_bytes_from(read_meta(PROBE)) == kv_bytes_per_token(LLAMA_8B) == 131072


@pytest.mark.slow
def test_the_h100_probe_chains_fit_within_a_few_percent_once_local_hits_are_mended() -> None:
    """The pool-on replicas' local-hit counter ran to 4-5x the prompt; fitted as
    recorded, the cold 128k cell was modeled 63% short and the attention term sat at
    its bound 0. Mended by the usage's cached tokens, every cold and pool cell is within
    5% and the attention term is identified."""
    result = fit.fit_runs([PROBE], resamples=1000)
    assert "attn_s_per_ktok2" not in result.not_identified
    cells = list(result.residuals.iter_rows(named=True))
    assert len(cells) == 12  # 4 sizes x cold, local, pool
    for row in cells:
        if row["path"] in ("cold", "pool"):
            assert abs(row["median_error"]) < 0.05, row


def test_the_shipped_h100_profile_names_its_gpu_runs_and_held_out_error() -> None:
    path = PROFILES_DIR / "h100-llama8b.toml"
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    table, sim = data["fit"], data["target"]["sim"]
    assert "H100" in text.splitlines()[2]
    assert table["fitted"] is True and table["runs"] == [PROBE.name]
    assert (RUNS / table["runs"][0]).is_dir()
    assert sim["kv_bytes_per_token"] == 131072 and sim["pool_chunk_tokens"] == 256
    for key, (low, high) in table["interval"].items():
        assert low <= sim[key] <= high, key
    assert table["model_error"]["cells_one_in_flight"] == 2
