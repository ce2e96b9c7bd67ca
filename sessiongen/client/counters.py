"""Server counters from ``GET /metrics`` (Prometheus text), parsed with prometheus_client.

The counters sessiongen attributes cache hits with (vLLM names, cumulative tokens; the
names are the records' :mod:`sessiongen.records.counters`):

- ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``: the replica's
  own (GPU) prefix cache;
- ``vllm:external_prefix_cache_queries_total`` / ``vllm:external_prefix_cache_hits_total``:
  the KV connector (LMCache's shared pool).

A delta between two snapshots of one replica counts the tokens served in between; it is
exact per request when no other request to that replica overlapped.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sessiongen.records.counters import (
    EXTERNAL_HITS,
    EXTERNAL_QUERIES,
    LOCAL_HITS,
    LOCAL_QUERIES,
    RUNNING,
    TRACKED,
    WAITING,
)

__all__ = [
    "EXTERNAL_HITS",
    "EXTERNAL_QUERIES",
    "LOCAL_HITS",
    "LOCAL_QUERIES",
    "RUNNING",
    "TRACKED",
    "WAITING",
    "Snapshot",
    "delta",
    "parse",
    "snapshot",
]

#: Tracked counters of one replica at one moment, by name.
Snapshot = dict[str, float]


def parse(text: str) -> Snapshot:
    """Sum each tracked sample over its labels; missing counters are absent from the result."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in TRACKED:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


async def snapshot(session: aiohttp.ClientSession, base_url: str) -> Snapshot | None:
    """Tracked counters of one replica, or None when /metrics cannot be read."""
    try:
        async with session.get(base_url.rstrip("/") + "/metrics") as resp:
            if resp.status != 200:
                return None
            return parse(await resp.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def delta(
    before: Mapping[str, float] | None, after: Mapping[str, float] | None, name: str
) -> int | None:
    """Counter increase between two snapshots, or None when either lacks it."""
    if not before or not after or name not in before or name not in after:
        return None
    return round(after[name] - before[name])
