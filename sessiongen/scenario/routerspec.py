"""Routers in the loop: the ``router:POLICY`` and ``gateway`` placements and ``[target.router]``.

A placement ``router:POLICY`` sends every turn of a block to a vllm-router that
sessiongen starts in front of the block's replicas with ``--policy POLICY``; the placement
``gateway`` sends every turn to an existing router the user names (``target.gateway``).
Either way the router, not the client, picks the replica, and replay finds out which
one served each turn.

What vllm-router 0.1.17 keys each policy on, for chat requests (measured against the
simulated pair, 2 workers; see docs/guides/routers.md):

- ``consistent_hash``: the first non-empty header of ``x-session-id``, ``x-user-id``,
  ``x-tenant-id``, ``x-correlation-id``, ``x-request-id``, ``x-trace-id``. Without one
  every chat request hashes the same empty key and lands on one replica; the body's
  ``user`` field is ignored. Hence the session header on every routed request.
- ``sticky_least_loaded``: the same headers; new sessions go to the replica with the
  fewest active sessions, then stay.
- ``cache_aware``: the messages' text only (a character radix tree per worker); headers
  and ``user`` are ignored. Sequential traffic piles new sessions onto one replica.
- ``round_robin``, ``random``, ``power_of_two``: nothing of the request.
- ``kv_aware``: vLLM's KV events (ZMQ); without them every request goes to one replica.

This module is pure data, so the scenario schema embeds it without importing the
launcher.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sessiongen.scenario.schema import spec

#: The ``--policy`` values of vllm-router 0.1.17.
ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
    "kv_aware",
)

#: The placement that sends every turn to ``target.gateway``, an existing router.
GATEWAY = "gateway"

_ROUTER_PREFIX = "router:"
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")


def router_policy(placement: str) -> str | None:
    """The vllm-router policy of a ``router:POLICY`` placement, else None."""
    if placement.startswith(_ROUTER_PREFIX):
        return placement[len(_ROUTER_PREFIX) :]
    return None


def is_routed(placement: str) -> bool:
    """True when a router, not the client, picks the replica (``router:*``, ``gateway``)."""
    return placement == GATEWAY or router_policy(placement) is not None


def check_header_name(value: str | None) -> str | None:
    """An HTTP header name (RFC 9110 token), or None."""
    if value is None or _HEADER_RE.match(value):
        return None
    return "expected an HTTP header name (letters, digits, '-', no spaces)"


@dataclass(frozen=True)
class RouterSpec:
    """What routed placements send, and vllm-router as sessiongen starts it per block.

    Part of ``[target]``: like the target, it shapes where requests go, not what the
    sessions are, so it stays out of the scenario digest.
    """

    session_header: str = spec(
        "X-Session-ID",
        check=check_header_name,
        doc="the request header that carries the session id on every routed request "
        "(what consistent_hash and sticky_least_loaded key on)",
    )
    session_user: bool = spec(
        False, doc="also send the session id as the request body's user field"
    )
    args: tuple[str, ...] = spec(
        (),
        empty="none",
        repeats="a command line may repeat a value",
        any_order="a command line, in the order given",
        doc="extra vllm-router arguments (e.g. --cache-threshold)",
    )
    retries: bool = spec(
        False,
        doc="let the router retry a failed request (on another worker, unseen); off by "
        "default, so a retry never moves or repeats a turn behind the measurement's back",
    )
    request_timeout_s: float = spec(
        3600.0, gt=0, doc="the router's cap on a whole request, stream included"
    )
    startup_timeout_s: float = spec(120.0, gt=0, doc="wait this long for /readiness")
