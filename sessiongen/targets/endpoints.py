"""Existing OpenAI-compatible replicas the user names, all in one cache arm.

They cannot be restarted, so each block gets its own salt and never meets a cache left
by an earlier block or run; only the blocks of their own arm (``--cache on|off``) run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from sessiongen.errors import EndpointError
from sessiongen.records.format import BlockFacts


class EndpointsTarget:
    """Existing replicas at fixed URLs, all in one cache arm."""

    kind = "endpoints"
    simulated = False
    time_scale = 1.0
    restarts = False
    pool_chunk_tokens: int | None = None  # LMCache's is not visible from outside

    def __init__(self, urls: list[str], cache: str, model: str) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.cache = cache
        self.model = model
        self.n_replicas = len(self.urls)
        self.servers: list[dict[str, Any]] = []

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return [b for b in blocks if b == self.cache]

    async def preflight(self, timeout_s: float = 10.0) -> None:
        """Fail before any work when an endpoint is unreachable or lacks the model."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for url in self.urls:
                facts: dict[str, Any] = {"url": url}
                try:
                    async with http.get(url + "/v1/models") as resp:
                        if resp.status != 200:
                            raise EndpointError(
                                f"{url}: GET /v1/models answered HTTP {resp.status}"
                            )
                        models = await resp.json(content_type=None)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    raise EndpointError(
                        f"{url}: unreachable ({type(exc).__name__}: {exc})"
                    ) from None
                ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
                if self.model not in ids:
                    raise EndpointError(
                        f"{url}: does not serve model {self.model!r} (it serves {ids}); "
                        "set model.name in the scenario"
                    )
                facts["models"] = models
                facts["version"] = await _get_json(http, url + "/version")
                self.servers.append(facts)

    def attach(self, run_dir: Path) -> None:
        return None  # nothing of theirs to log here

    def tokenizer_url(self) -> str | None:
        return self.urls[0]

    async def open_block(self, cache: str) -> list[str]:
        return self.urls

    async def close_block(self) -> BlockFacts:
        return {"restarted": False}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "endpoints",
            "simulated": False,
            "time_scale": 1.0,
            "cache": self.cache,
            "endpoints": self.urls,
            "servers": self.servers,
        }

    async def close(self) -> None:
        return None


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
