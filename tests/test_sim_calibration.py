"""The default profile reproduces the study's TTFT table within 10%."""

from __future__ import annotations

import dataclasses

import pytest

from sessiongen.sim import model
from sessiongen.sim.calibration import PROBES, STUDY_TTFT_S, calibration_table, probe_hits
from sessiongen.sim.profile import SimProfile

TOLERANCE = 0.10


@pytest.mark.parametrize("n", sorted(STUDY_TTFT_S))
@pytest.mark.parametrize("probe", PROBES)
def test_pure_model_matches_study_cell(n: int, probe: str) -> None:
    modeled, study = calibration_table(SimProfile())[n][probe]  # type: ignore[index]
    assert modeled == pytest.approx(study, rel=TOLERANCE)


def test_probe_hits_follow_block_and_chunk_alignment() -> None:
    hits = probe_hits(SimProfile(), 128_000)
    assert hits["cold"] == (128_000, 0, 0)
    assert hits["local"] == (128_032, 128_000, 0)  # 8,000 whole 16-token blocks
    assert hits["cross"] == (128_032, 0, 81 * 1568)  # 81 whole chunks, tail recomputed


def test_slowdown_multiplies_every_modeled_latency() -> None:
    base = SimProfile()
    slow = dataclasses.replace(base, slowdown=1.5)
    for args in ((128_032, 128_000, 0), (128_032, 0, 127_008), (1000, 0, 0)):
        assert model.request_timing(slow, *args).ttft_s == pytest.approx(
            1.5 * model.request_timing(base, *args).ttft_s
        )
    assert model.itl_s(slow, 5000, 3) == pytest.approx(1.5 * model.itl_s(base, 5000, 3))


def test_itl_grows_with_context_and_batch() -> None:
    p = SimProfile()
    assert model.itl_s(p, 100_000, 1) > model.itl_s(p, 1_000, 1)
    assert model.itl_s(p, 1_000, 8) > model.itl_s(p, 1_000, 1)


def test_hit_overhead_is_flat_outside_its_table_and_zero_without_local_hit() -> None:
    p = SimProfile()
    assert model.hit_overhead_s(p, 0) == 0.0
    assert model.hit_overhead_s(p, 10**7) == pytest.approx(p.hit_overhead_s[-1])
    mid = (p.hit_overhead_tokens[1] + p.hit_overhead_tokens[2]) // 2
    assert p.hit_overhead_s[1] < model.hit_overhead_s(p, mid) < p.hit_overhead_s[2]
