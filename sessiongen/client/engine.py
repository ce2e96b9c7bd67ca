"""What a vLLM replica says of its own engine: KV block, KV cache size, scheduler limits.

Read once per replica when a block opens, so a run's manifest says how the pair was
built where it matters for predicting it (``sessiongen fit`` writes these into the
profile). Three sources, each optional, later ones filling only what earlier ones lack:

- ``GET /server_info?config_format=json`` (vLLM's dev mode, ``VLLM_SERVER_DEV_MODE=1``):
  the whole engine config, the scheduler's ``max_num_batched_tokens`` and
  ``max_num_seqs`` included;
- ``GET /metrics``, the gauge ``vllm:cache_config_info``: ``block_size``,
  ``kv_cache_size_tokens`` and ``num_gpu_blocks`` as labels (vLLM 0.32; older versions
  lack the token count, which is then blocks x block size);
- ``GET /v1/models``: ``max_model_len`` of the served model.

What a replica says of its KV connector (``kv_connector``, :class:`KvConnector`; both
typed records are the manifest's, :mod:`sessiongen.records.format`) comes
from the same answers: ``vllm_config.kv_transfer_config`` of ``/server_info`` (null
without a connector; only in dev mode), else the simulator's ``sessiongen_sim_info``
gauge (its ``shared_cache`` label), plus the connector-related metric names that
``/metrics`` lists. vLLM 0.32 registers ``vllm:external_prefix_cache_*`` with or without
a connector, and LMCache's multi-process connector adds no metric of its own, so those
names alone never tell the arm; they are recorded as found.

A server that is not vLLM answers none of them, and its facts are empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sessiongen.records.format import EngineFacts, KvConnector

CACHE_CONFIG_INFO = "vllm:cache_config_info"
SIM_INFO = "sessiongen_sim_info"
#: Metric families whose presence is recorded as what a replica says of its connector.
CONNECTOR_METRIC_PREFIXES = (
    "vllm:external_prefix_cache",
    "vllm:kv_connector",
    "vllm:kv_transfer",
    "vllm:nixl",
    "lmcache",
)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def from_cache_config(metrics_text: str) -> EngineFacts:
    """Facts from the labels of ``vllm:cache_config_info`` (empty when absent)."""
    out: EngineFacts = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name != CACHE_CONFIG_INFO:
                continue
            labels = sample.labels
            block = _int(labels.get("block_size"))
            blocks = _int(labels.get("num_gpu_blocks"))
            tokens = _int(labels.get("kv_cache_size_tokens"))
            if block is not None:
                out["block_size"] = block
            if blocks is not None:
                out["num_blocks"] = blocks
            if tokens is None and block is not None and blocks is not None:
                tokens = block * blocks
            if tokens is not None:
                out["kv_cache_tokens"] = tokens
            return out
    return out


def _at(config: dict[str, Any], section: str, key: str) -> int | None:
    values = config.get(section)
    return _int(values.get(key)) if isinstance(values, dict) else None


def from_server_info(info: Any) -> EngineFacts:
    """Facts from ``/server_info?config_format=json`` (empty when it is not that)."""
    config = info.get("vllm_config") if isinstance(info, dict) else None
    if not isinstance(config, dict):
        return {}
    out: EngineFacts = {}
    batched = _at(config, "scheduler_config", "max_num_batched_tokens")
    seqs = _at(config, "scheduler_config", "max_num_seqs")
    block = _at(config, "cache_config", "block_size")
    length = _at(config, "model_config", "max_model_len")
    if batched is not None:
        out["max_num_batched_tokens"] = batched
    if seqs is not None:
        out["max_num_seqs"] = seqs
    if block is not None:
        out["block_size"] = block
    if length is not None:
        out["max_model_len"] = length
    cache = config.get("cache_config")
    if isinstance(cache, dict):
        tokens = _int(cache.get("kv_cache_size_tokens"))
        blocks = _int(cache.get("num_gpu_blocks"))
        if tokens is not None:
            out["kv_cache_tokens"] = tokens
        if blocks is not None:
            out["num_blocks"] = blocks
    return out


def connector_from_server_info(info: Any) -> KvConnector:
    """``kv_transfer_config`` of ``/server_info?config_format=json`` (empty when absent)."""
    config = info.get("vllm_config") if isinstance(info, dict) else None
    if not isinstance(config, dict) or "kv_transfer_config" not in config:
        return {}
    transfer = config["kv_transfer_config"]
    name = transfer.get("kv_connector") if isinstance(transfer, dict) else None
    out: KvConnector = {"configured": bool(name), "source": "server_info"}
    if name:
        out["connector"] = str(name)
        role = transfer.get("kv_role") if isinstance(transfer, dict) else None
        if role:
            out["role"] = str(role)
    return out


def connector_from_metrics(metrics_text: str) -> KvConnector:
    """Connector-related metric names, and the simulator's shared-cache label."""
    out: KvConnector = {}
    names = []
    for family in text_string_to_metric_families(metrics_text):
        if family.name.startswith(CONNECTOR_METRIC_PREFIXES) and not family.name.endswith(
            "_created"  # prometheus_client's creation-time gauge beside every counter
        ):
            names.append(family.name)
        if family.name == SIM_INFO:
            for sample in family.samples:
                shared = sample.labels.get("shared_cache")
                if shared in ("on", "off"):
                    out["configured"] = shared == "on"
                    out["source"] = SIM_INFO
    if names:
        out["metrics"] = sorted(names)
    return out


def reported_arm(connector: Mapping[str, Any] | None) -> str | None:
    """The cache arm a replica's :class:`KvConnector` facts say: "on" (a connector is
    configured), "off" (none is), or None (it does not say)."""
    configured = (connector or {}).get("configured")
    if not isinstance(configured, bool):
        return None
    return "on" if configured else "off"


def from_models(models: Any) -> EngineFacts:
    """``max_model_len`` from ``/v1/models`` (vLLM adds it to each model entry)."""
    data = models.get("data") if isinstance(models, dict) else None
    for entry in data if isinstance(data, list) else []:
        value = _int(entry.get("max_model_len")) if isinstance(entry, dict) else None
        if value is not None:
            return {"max_model_len": value}
    return {}


async def _get(http: aiohttp.ClientSession, url: str, *, json: bool) -> Any:
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                return None
            return await (resp.json(content_type=None) if json else resp.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def engine_facts(http: aiohttp.ClientSession, base_url: str) -> EngineFacts:
    """What the replica at ``base_url`` tells of its engine (see the module doc)."""
    base = base_url.rstrip("/")
    info = await _get(http, base + "/server_info?config_format=json", json=True)
    metrics = await _get(http, base + "/metrics", json=False)
    models = await _get(http, base + "/v1/models", json=True)
    told = from_server_info(info)
    counted = from_cache_config(metrics) if isinstance(metrics, str) else EngineFacts()
    listed = from_models(models)
    sources = [n for n, f in (("server_info", told), ("metrics", counted), ("models", listed)) if f]
    out: EngineFacts = {**listed, **counted, **told}  # earlier sources win
    if sources:
        out["sources"] = sources
    metered = connector_from_metrics(metrics) if isinstance(metrics, str) else KvConnector()
    connector: KvConnector = {**metered, **connector_from_server_info(info)}
    if connector:
        out["kv_connector"] = connector
    return out
