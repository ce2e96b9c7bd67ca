"""Existing OpenAI-compatible replicas the user names, all in one cache arm.

They cannot be restarted, so each block gets its own salt and never meets a cache left
by an earlier block or run; only the blocks of their own arm (``--cache on|off``) run.
Both arms on one's own replicas: a pair per arm (:mod:`.pairs`), one pair switched by
the user's command (:mod:`.switched`), or a run per arm merged afterwards
(:mod:`sessiongen.records.merge`).

A router may stand in front of them: the user's own (``--gateway URL``, placement
``gateway``; the replicas' URLs are then optional and serve only to find which replica
served a turn from their counters), or a vllm-router that sessiongen starts per block
(``router:POLICY``).

Replicas may themselves be simulated (``sessiongen sim serve`` elsewhere): when every
replica's ``/version`` says ``"simulated": true`` the run is labelled SIMULATED, and
when they also say their ``time_scale`` (all the same), durations are converted to
modeled seconds as for the embedded pair (:func:`simulation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import aiohttp

from sessiongen.client.engine import engine_facts
from sessiongen.errors import EndpointError, ScenarioError
from sessiongen.records.format import (
    BlockFacts,
    EngineFacts,
    KvConnector,
    ServerFacts,
    TargetInfo,
)
from sessiongen.scenario.routerspec import RouterSpec, is_routed
from sessiongen.targets.base import ServedBy
from sessiongen.targets.router import RouterFront, router_log


@dataclass(frozen=True)
class Simulation:
    """What the replicas say they are: simulated or not, and at which time scale.

    ``time_scale`` is None for replicas that say they are simulated but not their time
    scale (an older simulator): their durations stay measured seconds.
    """

    simulated: bool = False
    time_scale: float | None = None

    def describe(self) -> TargetInfo:
        """The manifest's target facts: ``simulated``, ``time_scale`` (1 when unknown),
        and for simulated replicas where the time scale came from, or that it is unknown."""
        if not self.simulated:
            return {"simulated": False, "time_scale": 1.0}
        facts: TargetInfo = {
            "simulated": True,
            "note": "SIMULATED: the endpoints say they are simulated replicas (/version)",
            "time_scale": self.time_scale or 1.0,
            "time_scale_known": self.time_scale is not None,
        }
        if self.time_scale is not None:
            facts["time_scale_from"] = "/version"
        return facts


def simulation(servers: Sequence[ServerFacts]) -> Simulation:
    """What the preflight's ``servers`` (each with its ``/version`` JSON) say they are.

    The replicas decide (a gateway only when it is all there is: a router in front may
    say nothing of itself). Replicas that disagree, simulated and not, or at different
    time scales, cannot be read in one unit: an :class:`EndpointError`.
    """
    replicas = [s for s in servers if not s.get("gateway")] or list(servers)
    said = [(s["url"], s.get("version")) for s in replicas]
    sim = [(url, v) for url, v in said if isinstance(v, dict) and v.get("simulated") is True]
    if not sim:
        return Simulation()
    if len(sim) < len(said):
        real = next(url for url, v in said if (url, v) not in sim)
        raise EndpointError(
            f"{sim[0][0]}: says it is simulated (/version) and {real} does not: "
            "replay replicas of one kind"
        )
    said_scales = {url: v.get("time_scale") for url, v in sim}
    scales = {url: x for url, x in said_scales.items() if _positive(x)}
    if len(scales) < len(said_scales):
        return Simulation(simulated=True)
    distinct = sorted(set(scales.values()))
    if len(distinct) > 1:
        first, other = (next(u for u, x in scales.items() if x == d) for d in distinct[:2])
        raise EndpointError(
            f"{first}: time scale {distinct[0]:g} and {other}: {distinct[1]:g} (/version): "
            "serve every simulated replica at one --time-scale"
        )
    return Simulation(simulated=True, time_scale=distinct[0])


def _positive(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


class EndpointsTarget:
    """Existing replicas at fixed URLs, all in one cache arm."""

    kind = "endpoints"
    restarts = False
    pool_chunk_tokens: int | None = None  # LMCache's is not visible from outside

    def __init__(
        self,
        urls: list[str],
        cache: str,
        model: str,
        *,
        gateway: str | None = None,
        placements: tuple[str, ...] = (),
        router: RouterSpec | None = None,
        replica_header: str | None = None,
        replica_names: tuple[str, ...] = (),
        source: str = "scenario",
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.cache = cache
        self.model = model
        self.n_replicas = len(self.urls)
        self.servers: list[ServerFacts] = []
        self.placements = placements
        self.source = source
        self.routers = RouterFront(router or RouterSpec(), gateway)
        # Without names, a replica is named by its index (in the order of self.urls).
        names = replica_names or tuple(str(i) for i in range(self.n_replicas))
        self.served_by = ServedBy(
            header=replica_header, fingerprint=bool(replica_names), names=names
        )
        self._log_dir: Path | None = None
        self._blocks = 0
        # What the replicas say they are, known after the preflight: simulated replicas'
        # own time scale (wall seconds per modeled second), else 1.
        self.sim = Simulation()
        self.simulated = False
        self.time_scale = 1.0

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return [b for b in blocks if b == self.cache]

    async def preflight(self, timeout_s: float = 10.0) -> None:
        """Fail before any work when an endpoint is unreachable or lacks the model, or a
        placement cannot run here (client placements need the replicas' URLs)."""
        self.routers.preflight(self.placements, source=self.source)
        client_placed = [p for p in self.placements if not is_routed(p)]
        if client_placed and not self.urls:
            raise ScenarioError(
                self.source,
                "placement.policies",
                f"{client_placed[0]!r} sends turns to replicas the client picks: give their "
                "URLs (--endpoints), or keep only routed placements (gateway, router:POLICY)",
            )
        gateway = [self.routers.gateway] if self.routers.gateway else []
        self.servers = await probe_servers(self.urls, self.model, gateway, timeout_s)
        self.sim = simulation(self.servers)
        self.simulated, self.time_scale = self.sim.simulated, self.sim.time_scale or 1.0

    def attach(self, run_dir: Path) -> None:
        self._log_dir = run_dir  # the routers sessiongen starts log there

    def tokenizer_url(self) -> str | None:
        return self.urls[0] if self.urls else self.routers.gateway

    def block_action(self, cache: str) -> str:
        where = ", ".join(self.urls) or self.routers.gateway or "?"
        return f"send to the given endpoints ({where}), stated to be cache {cache}"

    async def open_block(self, cache: str) -> list[str]:
        return self.urls

    def connectors(self) -> list[KvConnector]:
        return said_connectors(self.servers)

    async def open_gateway(self, placement: str) -> str | None:
        log = router_log(self._log_dir, f"router-{self._blocks}.log")
        return await self.routers.open(placement, self.urls, log)

    async def close_block(self, *, next_cache: str | None = None) -> BlockFacts:
        self._blocks += 1
        facts: BlockFacts = {"restarted": False, "kv_connector": said_connectors(self.servers)}
        await self.routers.close_into(facts)
        return facts

    def describe(self) -> TargetInfo:
        facts: TargetInfo = {
            "kind": "endpoints",
            **self.sim.describe(),
            "cache": self.cache,
            "endpoints": self.urls,
            "servers": self.servers,
        }
        return {**facts, **self.routers.target_facts(self.placements, self.served_by)}

    async def close(self) -> None:
        await self.routers.close()


async def probe_servers(
    urls: list[str], model: str, gateway: list[str], timeout_s: float = 10.0
) -> list[ServerFacts]:
    """Each URL's facts for the manifest (models, version, engine, which is the gateway);
    a one-line :class:`EndpointError` when one is unreachable or lacks ``model``."""
    servers: list[ServerFacts] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for url in [*urls, *gateway]:
            facts: ServerFacts = {"url": url}
            try:
                async with http.get(url + "/v1/models") as resp:
                    if resp.status != 200:
                        raise EndpointError(f"{url}: GET /v1/models answered HTTP {resp.status}")
                    models = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise EndpointError(f"{url}: unreachable ({type(exc).__name__}: {exc})") from None
            ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
            if model not in ids:
                raise EndpointError(
                    f"{url}: does not serve model {model!r} (it serves {ids}); "
                    "set model.name in the scenario"
                )
            facts["models"] = models
            facts["version"] = await _get_json(http, url + "/version")
            if url not in gateway:
                facts["engine"] = await engine_facts(http, url)
            facts["gateway"] = url in gateway
            servers.append(facts)
    return servers


def said_connectors(servers: Sequence[ServerFacts]) -> list[KvConnector]:
    """What each replica (not a gateway) said of its KV connector, in URL order."""
    return [
        KvConnector(**(s.get("engine", EngineFacts()).get("kv_connector") or {}))
        for s in servers
        if not s.get("gateway")
    ]


async def _get_json(http: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
