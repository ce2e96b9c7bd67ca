"""The managed target: replay's blocks on real vLLM + LMCache replicas started here.

Every block starts cold. By default (``design.restart_between_blocks = true``) each
block gets a freshly started pair (and, with the cache on, a fresh LMCache pool). With
``restart_between_blocks = false`` a block that follows one of the same cache arm (ON
to ON, or OFF to OFF across placements and load levels) runs on the same processes
with every cache emptied instead, which saves a pair start (1.5 to 3 minutes on 2
cores); the reset counts only once a cold probe proved it (see
:mod:`sessiongen.launch.reset`), else the pair is restarted and the block's manifest
entry says why. The exact command lines, environments and versions of every process,
and each pair's measured start-up time, go into the manifest, and so does a fault
planted in the connector (``target.managed.fault``: ``target.fault``, and per ON block
what it hit, from the replicas' fault logs). A replica that dies
mid-block is recorded and the block marked failed; the next block gets a new pair.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from sessiongen.client.engine import engine_facts
from sessiongen.infra.files import ensure_dir
from sessiongen.launch import commands, faults
from sessiongen.launch.pair import ManagedPair
from sessiongen.launch.tinymodel import RECIPES, tiny_model_identity
from sessiongen.records.format import (
    BlockFacts,
    KvConnector,
    TargetInfo,
)
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
    restarts = True  # every block starts cold: a fresh pair, or caches a cold probe saw empty

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
        self.reuse = not scenario.design.restart_between_blocks
        self._log_dir: Path | None = None
        self._pair: ManagedPair | None = None
        self._blocks: list[dict[str, object]] = []  # plain JSON for the manifest
        self._opened: BlockFacts = {}
        self._block_log_dir: Path | None = None
        self._connectors: list[KvConnector] = []  # what the pair's replicas said
        self._fault_from: dict[Path, int] = {}  # fault log -> its size when the block opened

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return list(blocks)

    async def preflight(self) -> None:
        self.routers.preflight(self.placements, source=self.source)

    def attach(self, run_dir: Path) -> None:
        self._log_dir = run_dir  # every process's log: block-<n>/<name>.log

    def tokenizer_url(self) -> str | None:
        return None

    def block_action(self, cache: str) -> str:
        connector = "with" if cache == "on" else "without"
        again = " (or keep the last one, caches emptied)" if self.reuse else ""
        return f"start a managed pair {connector} the KV connector{again}"

    async def open_block(self, cache: str) -> list[str]:
        base = self._log_dir or Path("runs") / "managed-logs"
        self._block_log_dir = log_dir = base / f"block-{len(self._blocks)}"
        opened: BlockFacts = {"restarted": True}
        pair = self._pair
        if pair is not None:  # kept by close_block, for a block of the same arm
            facts = await asyncio.to_thread(pair.reset_caches)
            if facts["verified"] and pair.cache_on == (cache == "on"):
                opened["restarted"] = False
                ensure_dir(log_dir)  # the block's own folder, for its router's log
            else:
                facts["fallback"] = "restart"
                await asyncio.to_thread(pair.stop)
                self._pair = pair = None
            opened["reset"] = facts
        if pair is None:
            pair = await self._start(cache, log_dir)
            opened["startup_s"] = pair.ready_s
        self._opened = opened
        self._fault_from = {path: _size(path) for path in self._fault_logs(pair)}
        block: dict[str, object] = {
            "cache": cache,
            "log_dir": str(pair.log_dir),
            "processes": pair.processes,
            **opened,
        }
        if self.spec.model in RECIPES:  # weights are generated: record which ones
            block["model_identity"] = tiny_model_identity(Path(pair.model_arg))
        if opened["restarted"]:  # what each replica's engine is (sessiongen fit reads it)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                engines = [await engine_facts(http, url) for url in pair.urls]
            block["engine"] = engines
            self._connectors = [KvConnector(**(e.get("kv_connector") or {})) for e in engines]
        opened["kv_connector"] = self._connectors
        self._blocks.append(block)
        return pair.urls

    async def _start(self, cache: str, log_dir: Path) -> ManagedPair:
        pair = ManagedPair(
            self.spec,
            self.model_name,
            cache == "on",
            log_dir,
            state_file=log_dir / "pair.json",
            resettable=self.reuse,
        )
        self._pair = pair
        try:
            await asyncio.to_thread(pair.start)
        except BaseException:
            await asyncio.to_thread(pair.stop)
            self._pair = None
            raise
        return pair

    def connectors(self) -> list[KvConnector]:
        return list(self._connectors)

    async def open_gateway(self, placement: str) -> str | None:
        pair = self._pair
        if pair is None:
            return None
        log = router_log(self._block_log_dir or pair.log_dir, "router.log")
        return await self.routers.open(placement, pair.urls, log)

    async def close_block(self, *, next_cache: str | None = None) -> BlockFacts:
        """Stop the block's router; stop its pair unless the next block (``next_cache``)
        is of the same arm and the pair may be reused (``restart_between_blocks`` off)."""
        router = await self.routers.close()
        facts, self._opened = self._opened.copy(), {}
        pair = self._pair
        if pair is None:
            return facts
        if router is not None:
            facts["router"] = router
        if self._fault_from:  # what the planted fault hit in this block's loads
            tally = faults.FaultTally()
            for path, offset in self._fault_from.items():
                tally += faults.read_log(path, offset)[0]
            facts["fault"] = tally.to_dict()
            self._fault_from = {}
        dead = pair.dead_replicas()
        lmcache_alive = pair.lmcache_alive()
        if dead or not lmcache_alive:
            facts["dead_replicas"] = dead
            facts["lmcache_alive"] = lmcache_alive
            facts["status"] = "failed"
        elif self.reuse and next_cache is not None and (next_cache == "on") == pair.cache_on:
            facts["kept"] = True  # the next block resets its caches instead of restarting
            return facts
        self._pair = None
        facts["stop"] = await asyncio.to_thread(pair.stop)
        return facts

    def describe(self) -> TargetInfo:
        facts: TargetInfo = {
            "kind": "managed",
            "simulated": False,
            "time_scale": 1.0,
            "replicas": self.n_replicas,
            "spec": to_plain(self.spec),
            "blocks": self._blocks,
        }
        if any(map(is_routed, self.placements)):
            facts["router"] = self.routers.describe()
        fault = faults.describe(self.spec.fault)
        if fault is not None:  # not the healthy stack: the report and the trend say so
            facts["fault"] = fault
        return facts

    def _fault_logs(self, pair: ManagedPair) -> list[Path]:
        if not self.spec.fault.planted:
            return []
        return [p for i in range(self.n_replicas) if (p := pair.fault_log(i)) is not None]

    async def close(self) -> None:
        await self.routers.close()
        if self._pair is not None:
            await asyncio.to_thread(self._pair.stop)
            self._pair = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
