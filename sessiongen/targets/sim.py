"""The embedded simulated replica pair as a target (a model, not a real server).

Started fresh for every block (so each block starts cold) with its shared cache
switched to the block's arm; with ``design.restart_between_blocks = false`` one process
serves every block and its caches are emptied between blocks instead. The simulator's
handle is held from the moment it is launched, so a replay interrupted while one starts
stops it like any other.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sessiongen.records.format import (
    BlockFacts,
    KvConnector,
    TargetInfo,
)
from sessiongen.scenario.routerspec import is_routed
from sessiongen.scenario.schema import to_plain
from sessiongen.scenario.spec import Scenario
from sessiongen.sim.process import SimHandle, launch_sim
from sessiongen.targets.base import ServedBy
from sessiongen.targets.router import RouterFront, router_log


class SimTarget:
    """The embedded simulated replicas."""

    kind = "sim"
    simulated = True

    def __init__(self, scenario: Scenario) -> None:
        self.profile = scenario.target.sim
        self.model_name = scenario.model.name
        self.time_scale = self.profile.time_scale
        self.n_replicas = self.profile.replicas
        self.restarts = scenario.design.restart_between_blocks
        self.pool_chunk_tokens: int | None = self.profile.pool_chunk_tokens
        # Every response says which simulated replica served it (index = URL order).
        self.served_by = ServedBy(
            header="x-sim-replica", names=tuple(str(i) for i in range(self.n_replicas))
        )
        self.placements = scenario.placement.policies
        self.source = scenario.source
        self.routers = RouterFront(scenario.target.router)
        self._handle: SimHandle | None = None
        self._urls: list[str] = []
        self._blocks = 0
        self._log_dir: Path | None = None

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return list(blocks)

    async def preflight(self) -> None:
        self.routers.preflight(self.placements, source=self.source)

    def attach(self, run_dir: Path) -> None:
        self._log_dir = run_dir  # per-request simulator logs: sim-<block>.log

    def tokenizer_url(self) -> str | None:
        return None

    def block_action(self, cache: str) -> str:
        if self.restarts:
            return f"start the simulated replicas with the shared cache {cache}"
        return f"keep one simulated process, shared cache {cache}, every cache emptied"

    async def open_block(self, cache: str) -> list[str]:
        shared = cache == "on"
        if self._handle is None:
            log = self._log_dir / f"sim-{self._blocks}.log" if self._log_dir else None
            handle = self._handle = launch_sim(self.profile, self.model_name, shared, log_path=log)
            try:
                await asyncio.to_thread(handle.wait_ready)
            except BaseException:  # failed (it is stopped), or cancelled (stop it now)
                self._handle = None
                await asyncio.to_thread(handle.stop)
                raise
            self._urls = list(handle.urls)
        else:  # kept running between blocks: switch the arm and drop all caches
            await asyncio.to_thread(self._handle.set_shared_cache, shared)
            await asyncio.to_thread(self._handle.reset, True)
        return self._urls

    def connectors(self) -> list[KvConnector]:
        return []  # started by sessiongen itself in the block's arm: nothing to contradict

    async def open_gateway(self, placement: str) -> str | None:
        log = router_log(self._log_dir, f"router-{self._blocks}.log")
        return await self.routers.open(placement, self._urls, log)

    async def close_block(self, *, next_cache: str | None = None) -> BlockFacts:
        self._blocks += 1
        facts: BlockFacts = {"restarted": self.restarts}
        await self.routers.close_into(facts)
        if self.restarts and self._handle is not None:
            facts["pid"] = self._handle.pid
            await asyncio.to_thread(self._handle.stop)
            self._handle = None
        return facts

    def describe(self) -> TargetInfo:
        facts: TargetInfo = {
            "kind": "sim",
            "simulated": True,
            "note": "SIMULATED: a calibrated model of vLLM + LMCache, not a real server",
            "time_scale": self.time_scale,
            "replicas": self.n_replicas,
            "profile": to_plain(self.profile),
        }
        if any(map(is_routed, self.placements)):
            facts["router"] = self.routers.describe()
        return facts

    async def close(self) -> None:
        await self.routers.close()
        if self._handle is not None:
            await asyncio.to_thread(self._handle.stop)
            self._handle = None
