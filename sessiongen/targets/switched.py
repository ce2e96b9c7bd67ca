"""One pair of existing replicas whose cache arm the user's own command switches.

``--endpoints A,B --switch-command 'CMD {arm}'`` (``target.switch_command``): before
every block, ``CMD`` runs in a shell with ``{arm}`` replaced by ``on`` or ``off`` (also
in ``$SESSIONGEN_ARM``), its output going to the run folder's ``switch-<n>.log``. It
should restart the replicas with or without the KV connector (or switch their cache in
whatever way the deployment allows) and may return before they are up again: sessiongen
then waits, within ``target.switch_timeout_s`` of the command's start, until every
replica answers ``/health`` and none reports the other arm (what a replica reports:
:func:`sessiongen.client.engine.reported_arm`; vLLM reports it in dev mode only, and a
replica that reports nothing is taken as switched: the counters then check the arm,
:mod:`sessiongen.analysis.arms`). A command that fails or times out, or replicas that
never come back in the arm, fail that block only; the next block runs the command again.

The command runs before every block, also between two blocks of the same arm, so that
it may restart the replicas there too. sessiongen cannot verify that a restart emptied
every cache, so every block gets its own salt, as with :mod:`.endpoints`.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import aiohttp

from sessiongen.client.engine import engine_facts, reported_arm
from sessiongen.errors import EndpointError
from sessiongen.infra import procs
from sessiongen.records.format import (
    BlockFacts,
    EngineFacts,
    KvConnector,
    ServerFacts,
    SwitchFacts,
    TargetInfo,
)
from sessiongen.scenario.routerspec import RouterSpec
from sessiongen.targets.base import ServedBy
from sessiongen.targets.endpoints import Simulation, probe_servers, simulation
from sessiongen.targets.router import RouterFront, router_log

ARM_PLACEHOLDER = "{arm}"
ARM_ENV = "SESSIONGEN_ARM"
#: Seconds between health and arm checks while replicas come back.
POLL_S = 0.5


def switch_command_for(command: str, arm: str) -> str:
    """The shell command that sets ``arm`` (``{arm}`` replaced)."""
    return command.replace(ARM_PLACEHOLDER, arm)


def run_switch(command: str, arm: str, log_path: Path, timeout_s: float) -> int:
    """Run the switch command for ``arm`` in its own process group, output to
    ``log_path``; its exit status. An :class:`EndpointError` when it outlasts
    ``timeout_s`` (it is then stopped, group and all)."""
    child = procs.spawn(
        ["/bin/sh", "-c", switch_command_for(command, arm)], {ARM_ENV: arm}, log_path
    )
    try:
        return child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        procs.stop_child("switch", child, 5.0)
        raise EndpointError(
            f"switch to cache {arm}: the command did not finish within {timeout_s:g} s "
            f"(target.switch_timeout_s); see {log_path}"
        ) from None


class SwitchedTarget:
    """One pair of existing replicas, switched between arms by the user's command."""

    kind = "switched"
    simulated = False
    time_scale = 1.0
    restarts = False  # a restart by the user's command is not verified cold: fresh salts
    pool_chunk_tokens: int | None = None

    def __init__(
        self,
        urls: list[str],
        command: str,
        model: str,
        *,
        timeout_s: float = 900.0,
        gateway: str | None = None,
        placements: tuple[str, ...] = (),
        router: RouterSpec | None = None,
        replica_header: str | None = None,
        replica_names: tuple[str, ...] = (),
        source: str = "scenario",
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.command = command
        self.model = model
        self.timeout_s = timeout_s
        self.n_replicas = len(self.urls)
        self.placements = placements
        self.source = source
        self.routers = RouterFront(router or RouterSpec(), gateway)
        names = replica_names or tuple(str(i) for i in range(self.n_replicas))
        self.served_by = ServedBy(
            header=replica_header, fingerprint=bool(replica_names), names=names
        )
        self.servers: list[ServerFacts] = []
        self.switches: list[SwitchFacts] = []  # one per block: command, outcome, engines
        self._log_dir: Path | None = None
        self.sim = Simulation()

    def runnable_blocks(self, blocks: tuple[str, ...]) -> list[str]:
        return list(blocks)

    async def preflight(self) -> None:
        """Fail before any work when a replica is unreachable or lacks the model."""
        self.routers.preflight(self.placements, source=self.source)
        gateway = [self.routers.gateway] if self.routers.gateway else []
        self.servers = await probe_servers(self.urls, self.model, gateway)
        self.sim = simulation(self.servers)
        self.simulated, self.time_scale = self.sim.simulated, self.sim.time_scale or 1.0

    def attach(self, run_dir: Path) -> None:
        self._log_dir = run_dir  # switch-<n>.log, router-<n>.log

    def tokenizer_url(self) -> str | None:
        return self.urls[0]

    def block_action(self, cache: str) -> str:
        return (
            f"run `{switch_command_for(self.command, cache)}`, then wait until "
            f"{', '.join(self.urls)} answer /health and none reports cache "
            f"{'off' if cache == 'on' else 'on'} (at most {self.timeout_s:g} s)"
        )

    async def open_block(self, cache: str) -> list[str]:
        n = len(self.switches)
        log = router_log(self._log_dir, f"switch-{n}.log")
        record: SwitchFacts = {
            "block": n,
            "arm": cache,
            "command": switch_command_for(self.command, cache),
            "log": str(log),
        }
        self.switches.append(record)
        start = time.monotonic()
        status = await asyncio.to_thread(run_switch, self.command, cache, log, self.timeout_s)
        record["exit_status"] = status
        record["command_s"] = round(time.monotonic() - start, 3)
        if status != 0:
            raise EndpointError(
                f"switch to cache {cache}: the command exited with status {status}: "
                f"{procs.log_tail(log, lines=1) or 'no output'} (see {log})"
            )
        engines = await self._wait_switched(cache, start + self.timeout_s)
        record["ready_s"] = round(time.monotonic() - start, 3)
        record["engine"] = engines
        said = [reported_arm(e.get("kv_connector")) for e in engines]
        record["reported_arm"] = said[0] if len(set(said)) == 1 else None
        return self.urls

    async def _wait_switched(self, cache: str, deadline: float) -> list[EngineFacts]:
        """Poll until every replica is healthy and none reports the other arm; each
        replica's engine facts then. An :class:`EndpointError` at ``deadline``."""
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                healthy = [await _healthy(http, url) for url in self.urls]
                if all(healthy):
                    engines = [await engine_facts(http, url) for url in self.urls]
                    wrong = [
                        url
                        for url, e in zip(self.urls, engines, strict=True)
                        if reported_arm(e.get("kv_connector")) not in (cache, None)
                    ]
                    if not wrong:
                        return engines
                    other = "off" if cache == "on" else "on"
                    why = f"still reporting cache {other}, not {cache}: {', '.join(wrong)}"
                else:
                    down = [u for u, ok in zip(self.urls, healthy, strict=True) if not ok]
                    why = f"not healthy: {', '.join(down)}"
                if time.monotonic() >= deadline:
                    raise EndpointError(
                        f"switch to cache {cache}: within {self.timeout_s:g} s "
                        f"(target.switch_timeout_s) the replicas were {why}"
                    )
                await asyncio.sleep(POLL_S)

    def connectors(self) -> list[KvConnector]:
        engines = self.switches[-1].get("engine") or [] if self.switches else []
        return [KvConnector(**(e.get("kv_connector") or {})) for e in engines]

    async def open_gateway(self, placement: str) -> str | None:
        log = router_log(self._log_dir, f"router-{len(self.switches) - 1}.log")
        return await self.routers.open(placement, self.urls, log)

    async def close_block(self, *, next_cache: str | None = None) -> BlockFacts:
        facts: BlockFacts = {"restarted": False}
        if self.switches:
            last = self.switches[-1]
            switch = last.copy()
            engines = switch.pop("engine", None) or []
            facts["switch"] = switch
            facts["kv_connector"] = [KvConnector(**(e.get("kv_connector") or {})) for e in engines]
        await self.routers.close_into(facts)
        return facts

    def describe(self) -> TargetInfo:
        facts: TargetInfo = {
            "kind": self.kind,
            **self.sim.describe(),
            "replicas": self.n_replicas,
            "endpoints": self.urls,
            "switch_command": self.command,
            "switch_timeout_s": self.timeout_s,
            "servers": self.servers,
            "blocks": self.switches,
        }
        return {**facts, **self.routers.target_facts(self.placements, self.served_by)}

    async def close(self) -> None:
        await self.routers.close()


async def _healthy(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/health") as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
