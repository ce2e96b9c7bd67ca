"""A fault planted in the managed replicas' KV connector: what is passed, and which chunks it hits.

``target.managed.fault`` (:class:`~sessiongen.scenario.spec.ManagedFault`) makes every
cache-ON replica load :mod:`.faultconnector` instead of LMCache's connector: vLLM imports
it by module path (``kv_connector_module_path`` in ``--kv-transfer-config``), so the
wrapper runs inside the vLLM process, where torch is, and nowhere else. This module is
its pure half, used on both sides of that command line: the connector config sessiongen
writes (:func:`extra_entry`), the one the wrapper reads back (:class:`FaultConfig`),
the seeded choice of the chunks a load brings back that the fault hits
(:func:`hit_chunks`), and the wrapper's record of what it did (one JSON line per load
from the pool, :func:`read_log`), which the managed target sums per block.

Which chunks are hit is a hash of the seed and the chunk's tokens together with every
token before it (the chunk's identity in the pool), not of a request id: the same prompt
is hit in the same chunks in every block, on every replica and in every run with the
same seed, so a fault run is reproducible and its detection can be measured per share.
"""

from __future__ import annotations

import array
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessiongen.scenario.spec import FAULT_KINDS, ManagedFault

#: The wrapper class and the module vLLM imports it from (inside the vLLM process only).
CONNECTOR_CLASS = "FaultyLMCacheMPConnector"
CONNECTOR_MODULE = "sessiongen.launch.faultconnector"
#: The key of ``kv_connector_extra_config`` that holds the fault (LMCache reads only
#: ``lmcache.mp.*`` keys, so it passes this one by).
EXTRA_KEY = "sessiongen.fault"
#: Each replica's record of the fault: one JSON line per load from the pool.
LOG_NAME = "fault-replica-{index}.jsonl"


@dataclass(frozen=True)
class FaultConfig:
    """The fault as the wrapper inside vLLM reads it from its connector config."""

    kind: str
    share: float
    seed: int
    log: str | None = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> FaultConfig:
        """Read :data:`EXTRA_KEY` of ``kv_connector_extra_config``; ValueError if malformed."""
        raw = extra.get(EXTRA_KEY)
        if not isinstance(raw, Mapping):
            raise ValueError(f"kv_connector_extra_config.{EXTRA_KEY}: expected a table")
        kind, share, seed, log = raw.get("kind"), raw.get("share"), raw.get("seed"), raw.get("log")
        if kind not in FAULT_KINDS or kind == "none":
            raise ValueError(f"{EXTRA_KEY}.kind: expected stale or noise, got {kind!r}")
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ValueError(f"{EXTRA_KEY}.share: expected a number in (0, 1], got {share!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"{EXTRA_KEY}.seed: expected an integer >= 0, got {seed!r}")
        if log is not None and not isinstance(log, str):
            raise ValueError(f"{EXTRA_KEY}.log: expected a path, got {log!r}")
        return cls(kind=str(kind), share=float(share), seed=seed, log=log)


def extra_entry(fault: ManagedFault, log: Path | None) -> dict[str, Any]:
    """The fault as ``kv_connector_extra_config[EXTRA_KEY]`` carries it to the wrapper,
    with the replica's log file (see :func:`read_log`)."""
    entry: dict[str, Any] = {"kind": fault.kind, "share": fault.share, "seed": fault.seed}
    if log is not None:
        entry["log"] = str(log)
    return entry


def describe(fault: ManagedFault) -> dict[str, Any] | None:
    """The fault for the run manifest (``target.fault``), None on the healthy stack."""
    if not fault.planted:
        return None
    return {
        "kind": fault.kind,
        "share": fault.share,
        "seed": fault.seed,
        "where": "KV chunks the cache-ON replicas load from the shared pool",
        "label": label(fault.kind, fault.share),
    }


def label(kind: str, share: float) -> str:
    """One phrase naming a planted fault (the manifest's ``target.fault.label``)."""
    what = {
        "stale": "left as their blocks were before the copy (read before it finished)",
        "noise": "overwritten with seeded noise",
    }.get(kind, kind)
    return f"{kind}, {share * 100:g}% of the KV chunks loaded from the shared pool {what}"


def _tokens_bytes(tokens: Sequence[int]) -> bytes:
    data = array.array("i", tokens)
    if data.itemsize != 4:  # pragma: no cover - every platform sessiongen runs on
        data = array.array("l", tokens)
    return data.tobytes()


def chunk_draws(
    token_ids: Sequence[int], start: int, end: int, chunk_tokens: int, seed: int
) -> list[float]:
    """One uniform draw in [0, 1) per chunk of ``token_ids[start:end]``, ``chunk_tokens`` each.

    Each is a keyed BLAKE2b hash of ``seed`` and the tokens up to the chunk's end (the
    tokens before ``start`` included), so a chunk's draw depends on its place in the
    prompt and nothing else. ``start`` and ``end`` are chunk boundaries (LMCache loads
    whole chunks); a partial last chunk gets a draw too.
    """
    if chunk_tokens < 1 or start < 0 or end < start:
        raise ValueError(f"bad chunk range: start {start}, end {end}, chunk {chunk_tokens}")
    hasher = hashlib.blake2b(
        key=seed.to_bytes(8, "little"), digest_size=8, person=b"sessiongen-fault"
    )
    hasher.update(_tokens_bytes(token_ids[:start]))
    draws = []
    for lo in range(start, end, chunk_tokens):
        hasher.update(_tokens_bytes(token_ids[lo : min(lo + chunk_tokens, end)]))
        draws.append(int.from_bytes(hasher.copy().digest(), "little") / 2**64)
    return draws


def hit_chunks(
    token_ids: Sequence[int], start: int, end: int, chunk_tokens: int, *, share: float, seed: int
) -> list[int]:
    """Indices (0 = the chunk at ``start``) of the chunks of a load the fault hits:
    those whose draw (:func:`chunk_draws`) is below ``share``; every one at share 1."""
    draws = chunk_draws(token_ids, start, end, chunk_tokens, seed)
    return [i for i, u in enumerate(draws) if u < share]


@dataclass(frozen=True)
class FaultTally:
    """What the fault did on one replica over a span of its log."""

    loads: int = 0  # loads from the pool (one per request that loaded)
    loads_hit: int = 0  # of them, loads with at least one chunk hit
    chunks: int = 0  # chunks those loads brought back
    chunks_hit: int = 0  # chunks the fault hit

    def __add__(self, other: FaultTally) -> FaultTally:
        return FaultTally(
            self.loads + other.loads,
            self.loads_hit + other.loads_hit,
            self.chunks + other.chunks,
            self.chunks_hit + other.chunks_hit,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "loads": self.loads,
            "loads_hit": self.loads_hit,
            "chunks": self.chunks,
            "chunks_hit": self.chunks_hit,
        }


def log_record(request_id: str, start: int, end: int, chunks: int, hit: Sequence[int]) -> str:
    """One line of a replica's fault log (what the wrapper writes per load)."""
    row = {"request": request_id, "start": start, "end": end, "chunks": chunks, "hit": list(hit)}
    return json.dumps(row, separators=(",", ":")) + "\n"


def read_log(path: Path, offset: int = 0) -> tuple[FaultTally, int]:
    """Sum the complete lines of a fault log from byte ``offset``; return the tally and
    the offset after the last complete line (a missing file is an empty log)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return FaultTally(), offset
    complete = data[: data.rfind(b"\n") + 1]
    tally = FaultTally()
    for line in complete.splitlines():
        row = json.loads(line)
        hit = len(row["hit"])
        tally += FaultTally(1, int(hit > 0), int(row["chunks"]), hit)
    return tally, offset + len(complete)
