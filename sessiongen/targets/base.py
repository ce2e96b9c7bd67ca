"""Targets: where a replay's requests go, one block at a time.

- :class:`SimTarget`: the embedded simulated pair, started fresh for every block
  (so each block starts cold) with its shared cache switched to the block's arm;
- :class:`EndpointsTarget`: existing OpenAI-compatible replicas the user names; they are
  in one cache arm (``--cache on|off``) and cannot be restarted, so each block gets its
  own salt and never meets a cache left by an earlier block or run;
- managed real replicas (vLLM + LMCache started by sessiongen) plug in through the same
  interface (:class:`Target`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from sessiongen.errors import EndpointError
from sessiongen.scenario.spec import Scenario


class Target(Protocol):
    """What replay needs from a target."""

    kind: str
    simulated: bool
    time_scale: float
    n_replicas: int
    restarts: bool  # True when every block runs on freshly started replicas

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        """The design's blocks this target can run (endpoints: only their own arm)."""
        ...

    async def open_block(self, cache: str) -> list[str]:
        """Make replicas ready for a block in cache arm ``cache``; return their base URLs."""
        ...

    async def close_block(self) -> dict[str, Any]:
        """End a block (stop replicas where the target restarts them); facts to record."""
        ...

    def describe(self) -> dict[str, Any]:
        """The manifest's ``target`` section."""
        ...

    async def close(self) -> None:
        """Release everything (idempotent)."""
        ...


class SimTarget:
    """The embedded simulated replica pair (a model, not a real server)."""

    kind = "sim"
    simulated = True

    def __init__(self, scenario: Scenario) -> None:
        self.profile = scenario.target.sim
        self.model_name = scenario.model.name
        self.time_scale = self.profile.time_scale
        self.n_replicas = self.profile.replicas
        self.restarts = scenario.design.restart_between_blocks
        self._handle: Any = None
        self._urls: list[str] = []
        self._blocks = 0
        self.log_dir: Path | None = None  # per-request simulator logs go here when set

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return list(blocks)

    async def open_block(self, cache: str) -> list[str]:
        from sessiongen.sim.process import start_sim

        shared = cache == "on"
        if self._handle is None:
            log = self.log_dir / f"sim-{self._blocks}.log" if self.log_dir else None
            self._handle = await asyncio.to_thread(
                start_sim, self.profile, self.model_name, shared, log_path=log
            )
            self._urls = list(self._handle.urls)
        else:  # kept running between blocks: switch the arm and drop all caches
            await asyncio.to_thread(self._handle.set_shared_cache, shared)
            await asyncio.to_thread(self._handle.reset, True)
        return self._urls

    async def close_block(self) -> dict[str, Any]:
        self._blocks += 1
        info: dict[str, Any] = {"restarted": self.restarts}
        if self.restarts and self._handle is not None:
            info["pid"] = getattr(self._handle, "pid", None)
            await asyncio.to_thread(self._handle.stop)
            self._handle = None
        return info

    def describe(self) -> dict[str, Any]:
        from sessiongen.scenario import schema

        return {
            "kind": "sim",
            "simulated": True,
            "note": "SIMULATED: a calibrated model of vLLM + LMCache, not a real server",
            "time_scale": self.time_scale,
            "replicas": self.n_replicas,
            "profile": schema.to_plain(self.profile),
        }

    async def close(self) -> None:
        if self._handle is not None:
            await asyncio.to_thread(self._handle.stop)
            self._handle = None


class EndpointsTarget:
    """Existing replicas at fixed URLs, all in one cache arm."""

    kind = "endpoints"
    simulated = False
    time_scale = 1.0
    restarts = False

    def __init__(self, urls: list[str], cache: str, model: str) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.cache = cache
        self.model = model
        self.n_replicas = len(self.urls)
        self.servers: list[dict[str, Any]] = []

    async def check(self, timeout_s: float = 10.0) -> None:
        """Fail before any work when an endpoint is unreachable or lacks the model."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for url in self.urls:
                facts = {"url": url}
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

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return [b for b in blocks if b == self.cache]

    async def open_block(self, cache: str) -> list[str]:
        return self.urls

    async def close_block(self) -> dict[str, Any]:
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
