"""Where each turn goes and which replica served it: the routing decision, in one place.

- **Client placements** (``alternate``, ``fixed``, ``random``, ``move-at:K``): the
  block's script picks the replica (:func:`~sessiongen.design.placement.replica_for`)
  and the turn is sent to it. ``replica_source`` is ``placement``.
- **Routed placements** (``router:POLICY``, ``gateway``): the turn goes to the block's
  gateway with the session id in ``target.router.session_header`` (and, if asked, in the
  body's ``user`` field); the router picks the replica. Which one served the turn is
  found afterwards and never guessed:

  1. **the response** names it, where the target's replicas do (:class:`ServedBy`): a
     header (the simulator's ``x-sim-replica``) or the final chunk's
     ``system_fingerprint`` (vLLM started with ``--fingerprint-mode custom``);
  2. **counters**: at concurrency 1 every replica's ``/metrics`` is read before and after
     the turn, and the one replica whose ``vllm:prefix_cache_queries_total`` moved (it
     counts every prompt token a replica is asked to prefill) served it;
  3. otherwise the replica is **unknown** (null), and so is ``cross_replica``.

  Where both 1 and 2 tell, they must agree (``replica_source`` joins them, e.g.
  ``header+counters``); when they disagree the replica is recorded as unknown
  (``conflict``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sessiongen.client import counters
from sessiongen.client.driver import Client, Result
from sessiongen.design.blocks import BlockPlan
from sessiongen.scenario.routerspec import is_routed
from sessiongen.scenario.spec import Scenario
from sessiongen.targets.base import ServedBy
from sessiongen.workload.sessions import TurnRequest


class Route(Protocol):
    """What routing needs of a block (:class:`~sessiongen.replay.runner.BlockContext`)."""

    @property
    def scenario(self) -> Scenario: ...
    @property
    def client(self) -> Client: ...
    @property
    def urls(self) -> tuple[str, ...]: ...
    @property
    def plan(self) -> BlockPlan: ...
    @property
    def gateway(self) -> str | None: ...
    @property
    def served_by(self) -> ServedBy: ...
    @property
    def api_path(self) -> str: ...
    @property
    def exact_counters(self) -> bool: ...


@dataclass(frozen=True)
class Served:
    """Which replica served a turn, how that was found, and its counters around the turn
    (exact only when no other request overlapped; else None)."""

    replica: int | None
    source: str
    before: counters.Snapshot | None = None
    after: counters.Snapshot | None = None


def named_replica(value: str, names: Sequence[str]) -> int | None:
    """The replica a response's header or fingerprint value names, or None.

    With ``names`` the value must be one of them; without, a non-negative integer is
    taken as the replica's own index (a gateway in front of replicas nobody listed).
    """
    value = value.strip()
    if names:
        return names.index(value) if value in names else None
    return int(value) if value.isdigit() else None


def from_response(res: Result, served_by: ServedBy) -> tuple[int | None, str | None]:
    """(replica, method) as the response names it; (None, None) when it says nothing,
    (None, method) when it names no replica we know."""
    if served_by.header is not None:
        value = res.headers.get(served_by.header.lower())
        if value is not None:
            return named_replica(value, served_by.names), "header"
    if served_by.fingerprint:
        value = (res.usage_chunk or {}).get("system_fingerprint")
        if isinstance(value, str):
            return named_replica(value, served_by.names), "fingerprint"
    return None, None


def from_counters(
    before: Sequence[counters.Snapshot | None], after: Sequence[counters.Snapshot | None]
) -> int | None:
    """The one replica whose prefill-query counter moved between the snapshots, or None
    (a replica unreadable, none moved, or several did)."""
    moved = []
    for replica, (b, a) in enumerate(zip(before, after, strict=True)):
        delta = counters.delta(b, a, counters.LOCAL_QUERIES)
        if delta is None:
            return None
        if delta > 0:
            moved.append(replica)
    return moved[0] if len(moved) == 1 else None


def resolve(response: tuple[int | None, str | None], counted: int | None) -> tuple[int | None, str]:
    """Combine what the response and the counters say into (replica, replica_source)."""
    named, method = response
    if named is not None and counted is not None:
        return (named, f"{method}+counters") if named == counted else (None, "conflict")
    if named is not None:
        return named, str(method)
    if counted is not None:
        return counted, "counters"
    return None, "unknown"


def moved(turn: int, previous: int | None, current: int | None) -> bool | None:
    """``cross_replica`` of a turn: False on turn 1, None when either replica is unknown."""
    if turn == 1:
        return False
    if previous is None or current is None:
        return None
    return previous != current


async def _snapshots(ctx: Route, urls: Sequence[str]) -> list[counters.Snapshot | None]:
    http = ctx.client.http
    return list(await asyncio.gather(*(counters.snapshot(http, url) for url in urls)))


async def send(
    ctx: Route,
    req: TurnRequest,
    *,
    replica: int | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[Result, Served]:
    """Send one turn to ``replica`` (a client placement's pick:
    :class:`~sessiongen.experiment.script.Send`), or through the block's gateway where
    its placement is routed (``replica`` None), measure it, and find its replica
    (``headers``: extra request headers, for placements the client picks)."""
    sc = ctx.scenario
    placement = ctx.plan.placement
    timeout_s = sc.driver.request_timeout_s
    if not is_routed(placement):
        if replica is None:
            raise RuntimeError(f"placement {placement!r} picks a replica, and none was given")
        url = ctx.urls[replica]
        http = ctx.client.http
        before = await counters.snapshot(http, url) if ctx.exact_counters else None
        res = await ctx.client.send(
            url + ctx.api_path, req.body_parts(sc), timeout_s=timeout_s, headers=headers
        )
        after = await counters.snapshot(http, url) if ctx.exact_counters else None
        return res, Served(replica, "placement", before, after)
    if ctx.gateway is None:
        raise RuntimeError(f"placement {placement!r} needs a gateway, and the block has none")
    spec = sc.target.router
    headers = {spec.session_header: req.session_id}
    user = req.session_id if spec.session_user else None
    exact = ctx.exact_counters and bool(ctx.urls)
    before_all = await _snapshots(ctx, ctx.urls) if exact else []
    res = await ctx.client.send(
        ctx.gateway + ctx.api_path,
        req.body_parts(sc, user=user),
        timeout_s=timeout_s,
        headers=headers,
    )
    after_all = await _snapshots(ctx, ctx.urls) if exact else []
    counted = from_counters(before_all, after_all) if exact else None
    found, source = resolve(from_response(res, ctx.served_by), counted)
    if exact and found is not None and found < len(ctx.urls):
        return res, Served(found, source, before_all[found], after_all[found])
    return res, Served(found, source)
