"""The managed target: replay's blocks on real vLLM + LMCache replicas started here.

Every block gets a freshly started pair (and, with the cache on, a fresh LMCache
pool), so each block starts cold; the exact command lines, environments and versions
of every process go into the manifest. A replica that dies mid-block is recorded and
the block marked failed; the run goes on with the next block on a new pair.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sessiongen.launch import commands
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.tinymodel import BUILTIN_TINY, tiny_model_identity
from sessiongen.records.format import BlockFacts
from sessiongen.scenario.routerspec import is_routed
from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.spec import Scenario
from sessiongen.targets.base import ServedBy
from sessiongen.targets.router import RouterFront, router_log


class ManagedTarget:
    """Real replicas that sessiongen starts and stops itself (see :class:`ManagedPair`)."""

    kind = "managed"
    simulated = False
    time_scale = 1.0
    restarts = True

    def __init__(self, scenario: Scenario) -> None:
        self.spec = scenario.target.managed
        self.model_name = scenario.model.name
        self.n_replicas = self.spec.replicas
        self.pool_chunk_tokens: int | None = self.spec.chunk_size
        # Each replica names itself in system_fingerprint where vLLM can (see
        # commands.fingerprint_supported); else routed turns are found by counters.
        self.served_by = (
            ServedBy(
                fingerprint=True,
                names=tuple(map(commands.replica_fingerprint, range(self.n_replicas))),
            )
            if commands.fingerprint_supported()
            else ServedBy()
        )
        self.placements = scenario.placement.policies
        self.source = scenario.source
        self.routers = RouterFront(scenario.target.router)
        self._log_dir: Path | None = None
        self._pair: ManagedPair | None = None
        self._blocks: list[dict[str, Any]] = []

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return list(blocks)

    async def preflight(self) -> None:
        self.routers.preflight(self.placements, source=self.source)

    def attach(self, run_dir: Path) -> None:
        self._log_dir = run_dir  # every process's log: block-<n>/<name>.log

    def tokenizer_url(self) -> str | None:
        return None

    async def open_block(self, cache: str) -> list[str]:
        base = self._log_dir or Path("runs") / "managed-logs"
        log_dir = base / f"block-{len(self._blocks)}"
        pair = ManagedPair(
            self.spec,
            self.model_name,
            cache == "on",
            log_dir,
            state_file=log_dir / "pair.json",
        )
        self._pair = pair
        try:
            await asyncio.to_thread(pair.start)
        except BaseException:
            await asyncio.to_thread(pair.stop)
            self._pair = None
            raise
        block = {"cache": cache, "log_dir": str(log_dir), "processes": pair.processes}
        if self.spec.model == BUILTIN_TINY:  # weights are generated: record which ones
            block["model_identity"] = tiny_model_identity(Path(pair.model_arg))
        self._blocks.append(block)
        return pair.urls

    async def open_gateway(self, placement: str) -> str | None:
        pair = self._pair
        if pair is None:
            return None
        return await self.routers.open(placement, pair.urls, router_log(pair.log_dir, "router.log"))

    async def close_block(self) -> BlockFacts:
        router = await self.routers.close()
        pair, self._pair = self._pair, None
        if pair is None:
            return {"restarted": True}
        dead = pair.dead_replicas()
        lmcache_alive = pair.lmcache_alive()
        outcome = await asyncio.to_thread(pair.stop)
        facts: BlockFacts = {"restarted": True, "stop": outcome}
        if router is not None:
            facts["router"] = router
        if dead or not lmcache_alive:
            facts["dead_replicas"] = dead
            facts["lmcache_alive"] = lmcache_alive
            facts["status"] = "failed"
        return facts

    def describe(self) -> dict[str, Any]:
        facts = {
            "kind": "managed",
            "simulated": False,
            "time_scale": 1.0,
            "replicas": self.n_replicas,
            "spec": to_plain(self.spec),
            "blocks": self._blocks,
        }
        if any(map(is_routed, self.placements)):
            facts["router"] = self.routers.describe()
        return facts

    async def close(self) -> None:
        await self.routers.close()
        if self._pair is not None:
            await asyncio.to_thread(self._pair.stop)
            self._pair = None
