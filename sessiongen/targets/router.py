"""Routers in front of a target's replicas: what every target does for routed placements.

A block whose placement is ``router:POLICY`` gets a fresh vllm-router
(:class:`~sessiongen.launch.router.ManagedRouter`) started in front of that block's
replicas, so its state (cache_aware's prefix tree, round_robin's counter, the sticky
sessions) starts empty like the replicas' caches, and is stopped when the block ends.
A block whose placement is ``gateway`` sends every turn to the user's own router
(``target.gateway``), which sessiongen neither starts nor stops. Client placements get
no router. Every target holds one :class:`RouterFront` and delegates to it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sessiongen.errors import ScenarioError
from sessiongen.launch.router import ManagedRouter, require_router, router_version
from sessiongen.records.format import (
    BlockFacts,
    RouterInfo,
    TargetInfo,
)
from sessiongen.scenario.routerspec import GATEWAY, RouterSpec, is_routed, router_policy
from sessiongen.scenario.schema import to_plain


def router_log(log_dir: Path | None, name: str) -> Path:
    """Where a block's router logs: the run folder, else the temporary folder."""
    if log_dir is not None:
        return log_dir / name
    return Path(tempfile.gettempdir()) / f"sessiongen-{os.getpid()}-{name}"


class RouterFront:
    """The router of the block that is open, if its placement has one."""

    def __init__(self, spec: RouterSpec, gateway: str | None = None) -> None:
        self.spec = spec
        self.gateway = gateway.rstrip("/") if gateway else None
        self._router: ManagedRouter | None = None
        self._started = 0

    def preflight(self, placements: Iterable[str], *, source: str = "scenario") -> None:
        """Fail before any work: vllm-router missing, or ``gateway`` without a URL."""
        placements = list(placements)
        if GATEWAY in placements and self.gateway is None:
            raise ScenarioError(
                source,
                "placement.policies",
                'placement "gateway" needs a router to send to: set target.gateway '
                "(or --gateway URL)",
            )
        if any(router_policy(p) is not None for p in placements):
            require_router()

    async def open(self, placement: str, worker_urls: list[str], log_path: Path) -> str | None:
        """The gateway URL for a block of ``placement`` (starting a router if it needs one)."""
        await self.close()
        if placement == GATEWAY:
            return self.gateway
        policy = router_policy(placement)
        if policy is None:
            return None
        router = ManagedRouter(policy, worker_urls, self.spec, log_path)
        self._router = router
        self._started += 1
        try:
            await asyncio.to_thread(router.start)
        except BaseException:
            self._router = None
            await asyncio.to_thread(router.stop)
            raise
        return router.url

    async def close(self) -> dict[str, object] | None:
        """Stop the block's router; what ran and how it stopped (None: no router)."""
        router, self._router = self._router, None
        if router is None:
            return None
        outcome = await asyncio.to_thread(router.stop)
        return {**router.facts(), "stop": outcome}

    async def close_into(self, facts: BlockFacts) -> None:
        """:meth:`close`, and what ran (if a router did) as the block's ``router`` fact."""
        router = await self.close()
        if router is not None:
            facts["router"] = router

    def target_facts(self, placements: Iterable[str], served_by: Any = None) -> TargetInfo:
        """The manifest target's ``router`` (and ``served_by``, a :class:`ServedBy`, when
        given) where some placement is routed; nothing otherwise."""
        if not any(map(is_routed, placements)):
            return {}
        facts: TargetInfo = {"router": self.describe()}
        if served_by is not None:
            facts["served_by"] = to_plain(served_by)
        return facts

    def describe(self) -> RouterInfo:
        """The manifest's ``target.router`` section."""
        return {
            "spec": to_plain(self.spec),
            "gateway": self.gateway,
            "vllm_router_version": router_version(),
            "routers_started": self._started,
        }
