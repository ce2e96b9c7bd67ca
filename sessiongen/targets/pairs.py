"""Two pairs of existing replicas, one per cache arm: the user's OFF pair and ON pair.

``--endpoints-off A,B --endpoints-on C,D`` (``target.endpoints_off``/``endpoints_on``):
a pair without the KV connector and one with it, both running all along. Each block
goes to the pair of its arm, so the whole design (OFF, ON, ON, OFF) runs in one replay.
Neither pair can be restarted, so every block gets its own salt (as with
:mod:`.endpoints`) and never meets a cache left by an earlier block; for the same
reason no prompt repeats across the arms, and the equivalence of answers across arms
is not exercised (the correctness verdicts say so).

A router sessiongen starts (``router:POLICY``) stands in front of the open block's
pair; the user's own gateway cannot, since one gateway cannot front both pairs.
"""

from __future__ import annotations

from pathlib import Path

from sessiongen.errors import ScenarioError
from sessiongen.records.format import (
    BlockFacts,
    KvConnector,
    ServerFacts,
    TargetInfo,
)
from sessiongen.scenario.routerspec import GATEWAY, RouterSpec
from sessiongen.targets.base import ServedBy
from sessiongen.targets.endpoints import Simulation, probe_servers, said_connectors, simulation
from sessiongen.targets.router import RouterFront, router_log

ARMS = ("off", "on")


class PairsTarget:
    """One pair of existing replicas per cache arm."""

    kind = "endpoint-pairs"
    simulated = False
    time_scale = 1.0
    restarts = False  # neither pair can be restarted: every block has its own salt
    pool_chunk_tokens: int | None = None  # LMCache's is not visible from outside

    def __init__(
        self,
        off_urls: list[str],
        on_urls: list[str],
        model: str,
        *,
        placements: tuple[str, ...] = (),
        router: RouterSpec | None = None,
        replica_header: str | None = None,
        replica_names: tuple[str, ...] = (),
        source: str = "scenario",
    ) -> None:
        self.pairs = {
            "off": [u.rstrip("/") for u in off_urls],
            "on": [u.rstrip("/") for u in on_urls],
        }
        self.model = model
        self.n_replicas = len(off_urls)
        self.placements = placements
        self.source = source
        self.routers = RouterFront(router or RouterSpec())
        names = replica_names or tuple(str(i) for i in range(self.n_replicas))
        self.served_by = ServedBy(
            header=replica_header, fingerprint=bool(replica_names), names=names
        )
        self.servers: dict[str, list[ServerFacts]] = {arm: [] for arm in ARMS}
        self.sim = Simulation()
        self._log_dir: Path | None = None
        self._open: str | None = None
        self._blocks = 0

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return list(blocks)

    async def preflight(self) -> None:
        """Fail before any work when a replica of either pair is unreachable or lacks
        the model, or a placement needs the user's gateway."""
        if GATEWAY in self.placements:
            raise ScenarioError(
                self.source,
                "placement.policies",
                '"gateway" needs one router in front of the replicas: not with '
                "endpoints_off/endpoints_on (use router:POLICY, started per block)",
            )
        self.routers.preflight(self.placements, source=self.source)
        for arm in ARMS:
            self.servers[arm] = await probe_servers(self.pairs[arm], self.model, [])
        self.sim = simulation([*self.servers["off"], *self.servers["on"]])
        self.simulated, self.time_scale = self.sim.simulated, self.sim.time_scale or 1.0

    def attach(self, run_dir: Path) -> None:
        self._log_dir = run_dir

    def tokenizer_url(self) -> str | None:
        return self.pairs["off"][0]

    def block_action(self, cache: str) -> str:
        connector = "with" if cache == "on" else "without"
        return f"send to the pair {connector} the KV connector ({', '.join(self.pairs[cache])})"

    async def open_block(self, cache: str) -> list[str]:
        self._open = cache
        return self.pairs[cache]

    def connectors(self) -> list[KvConnector]:
        return said_connectors(self.servers[self._open]) if self._open is not None else []

    async def open_gateway(self, placement: str) -> str | None:
        log = router_log(self._log_dir, f"router-{self._blocks}.log")
        return await self.routers.open(placement, self.pairs[self._open or "off"], log)

    async def close_block(self, *, next_cache: str | None = None) -> BlockFacts:
        self._blocks += 1
        facts: BlockFacts = {"restarted": False}
        if self._open is not None:
            facts["kv_connector"] = said_connectors(self.servers[self._open])
        self._open = None
        await self.routers.close_into(facts)
        return facts

    def describe(self) -> TargetInfo:
        facts: TargetInfo = {
            "kind": self.kind,
            **self.sim.describe(),
            "replicas": self.n_replicas,
            "endpoints_off": self.pairs["off"],
            "endpoints_on": self.pairs["on"],
            # One list, each server with its arm, as readers of "servers" expect.
            "servers": [{**s, "arm": arm} for arm in ARMS for s in self.servers[arm]],
        }
        return {**facts, **self.routers.target_facts(self.placements, self.served_by)}

    async def close(self) -> None:
        await self.routers.close()
