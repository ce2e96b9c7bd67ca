"""Does a built-in model fit one GPU, with a KV cache that holds a given context?

A replica's memory on its card: the weights (parameters x bytes per parameter: 2 in
bfloat16, 1 with vLLM's ``--quantization fp8``, which quantizes a bfloat16 checkpoint
as it loads), the KV cache for ``context_tokens`` (:func:`~.tinymodel.kv_bytes_per_token`
a token, in the serving dtype), and a reserve for activations, the CUDA context and
allocator slack (:data:`RESERVE_BYTES`). It fits when that total is within the share of
the card the replica takes (``--gpu-memory-utilization``). Arithmetic only, no GPU: the
run on the card is what tells the truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sessiongen.launch.tinymodel import Recipe, kv_bytes_per_token, weight_shapes

GIB = 2**30
RESERVE_BYTES = 6 * GIB
"""Activations of one 8,192-token prefill chunk (the MLP's widest intermediate, a few
GiB at 27B widths), the CUDA context and allocator slack, on top of weights and KV."""
WEIGHT_BYTES = {"bfloat16": 2, "fp8": 1}
"""Bytes per parameter on the card by weight format."""
CARDS_GIB = {"H100 80GB": 79.6, "H200": 139.8}
"""Usable memory of the cards the device tool lends, as nvidia-smi reports them."""


@dataclass(frozen=True)
class MemoryPlan:
    """One replica of a model on one card: what it needs and whether it fits."""

    weights_bytes: int
    kv_bytes: int
    reserve_bytes: int
    available_bytes: int

    @property
    def needed_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.reserve_bytes

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.available_bytes

    def line(self) -> str:
        def gib(b: int) -> str:
            return f"{b / GIB:.1f} GiB"

        verdict = "fits" if self.fits else "does not fit"
        return (
            f"weights {gib(self.weights_bytes)} + KV {gib(self.kv_bytes)} + reserve "
            f"{gib(self.reserve_bytes)} = {gib(self.needed_bytes)} of "
            f"{gib(self.available_bytes)}: {verdict}"
        )


def parameters(recipe: Recipe) -> int:
    """The model's parameter count (its tensors' sizes; the output head is tied)."""
    return sum(math.prod(shape) for shape in weight_shapes(recipe).values())


def memory_plan(
    recipe: Recipe,
    *,
    card_gib: float,
    context_tokens: int,
    weights: str = "bfloat16",
    utilization: float = 0.95,
) -> MemoryPlan:
    """One replica of ``recipe`` on a card of ``card_gib``, taking ``utilization`` of it,
    with a KV cache that holds ``context_tokens``."""
    if weights not in WEIGHT_BYTES:
        raise ValueError(f"weights: expected one of {sorted(WEIGHT_BYTES)}, got {weights!r}")
    return MemoryPlan(
        weights_bytes=parameters(recipe) * WEIGHT_BYTES[weights],
        kv_bytes=context_tokens * kv_bytes_per_token(recipe),
        reserve_bytes=RESERVE_BYTES,
        available_bytes=int(card_gib * utilization * GIB),
    )
