"""The 27B-class model's shape and where it fits: the two-GPU run's memory plan, on CPU."""

from __future__ import annotations

import pytest

from sessiongen.launch import memplan, tinymodel
from sessiongen.launch.memplan import CARDS_GIB, memory_plan

R27 = tinymodel.RECIPES["builtin:llama-27b"]
K128, K256 = 131_072, 262_144


def test_the_27b_recipe_has_a_27b_class_shape() -> None:
    assert 25e9 < memplan.parameters(R27) < 28e9
    c = R27.config
    assert tinymodel.kv_bytes_per_token(R27) == 2 * 62 * 8 * 128 * 2  # 248 KiB
    assert c["max_position_embeddings"] >= K256
    tiny = tinymodel.TINY
    assert c["hidden_size"] * R27.weight_std**2 == pytest.approx(
        tiny.config["hidden_size"] * tiny.weight_std**2
    )


def test_where_the_27b_replica_fits() -> None:
    h100, h200 = CARDS_GIB["H100 80GB"], CARDS_GIB["H200"]
    # bfloat16 weights leave an 80 GB card too little room for a 128k KV cache
    assert not memory_plan(R27, card_gib=h100, context_tokens=K128).fits
    # FP8 weights fit 128k there, not 256k
    assert memory_plan(R27, card_gib=h100, context_tokens=K128, weights="fp8").fits
    assert not memory_plan(R27, card_gib=h100, context_tokens=K256, weights="fp8").fits
    # an H200 holds bfloat16 weights and a 256k context
    assert memory_plan(R27, card_gib=h200, context_tokens=K256).fits


def test_the_8b_pair_on_one_h100_is_what_ran() -> None:
    """Two 8B replicas at 0.45 of one H100 each, a 128k KV cache (bench/gpu/2026-12-07)."""
    r8 = tinymodel.RECIPES["builtin:llama-8b"]
    plan = memory_plan(r8, card_gib=CARDS_GIB["H100 80GB"], context_tokens=K128, utilization=0.45)
    assert plan.fits and "fits" in plan.line()


def test_an_unknown_weight_format_is_refused() -> None:
    with pytest.raises(ValueError, match="weights"):
        memory_plan(R27, card_gib=80, context_tokens=K128, weights="int3")
