"""A scenario's requests written as a Mooncake-style trace (``sessiongen export``).

One line per (session, turn), session by session, in the format :mod:`.trace` reads:

- ``session_id``: the session's id; left out when sessions have a single turn, so each
  line is an independent request as in Mooncake's own traces;
- ``timestamp`` (ms) on a session's first turn: its scheduled start under
  ``load.arrival`` at the first load level (:func:`.arrivals.arrival_offsets`), in
  modeled milliseconds. A closed loop has no schedule (a session starts when a
  concurrency slot frees), so every session is written at 0: the concurrency cap is
  not something a trace can say;
- ``delay`` (ms) on later turns: the think time before the turn
  (:func:`.arrivals.think_times`), the pause after the previous answer;
- ``input_length``: the request's content tokens (every message's content, encoded
  message by message, without a chat template), ``output_length``: ``max_tokens``;
- ``hash_ids``: one id per block of ``block_tokens`` of those token ids, the last block
  partial. A block's id comes from a chained hash of its tokens and its predecessor's
  hash, so equal ids at a position mean equal prefixes through that block; ids are small
  integers given in order of first appearance, as Mooncake's are.

A trace scenario (``sessions.source = "trace"``) is written with its own schedule: each
session's first timestamp and each later turn's pause (a delay, or the timestamp gap),
as scaled by ``speedup``, and each line's ``output_length``; at speedup 1 a trace
exported this way is the trace read back (a test), up to the numbering of its ids.

Sessions are written in order of their start, so timestamps never decrease down the
file, and the file appears whole or not at all (:func:`~sessiongen.infra.files.atomic_write`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from sessiongen.design.arrivals import arrival_offsets
from sessiongen.errors import ScenarioError
from sessiongen.infra.files import atomic_write, ensure_dir
from sessiongen.scenario.spec import Scenario
from sessiongen.text.tokenize import Tokenizer
from sessiongen.workload.sessions import SessionBuilder, TurnRequest
from sessiongen.workload.textgen import generator_for
from sessiongen.workload.trace import DEFAULT_BLOCK_TOKENS


class BlockIds:
    """Small hash ids for token blocks, chained so that equal ids mean equal prefixes."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self._ids: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def of(self, tokens: Sequence[int]) -> list[int]:
        """The hash ids of ``tokens``' blocks, the last one partial."""
        out: list[int] = []
        prev = b""
        b = self.block_tokens
        for start in range(0, len(tokens), b):
            block = array("q", tokens[start : start + b]).tobytes()
            prev = hashlib.blake2b(prev + block, digest_size=16).digest()
            out.append(self._ids.setdefault(prev, len(self._ids)))
        return out


def turn_tokens(tokenizer: Tokenizer, request: TurnRequest) -> list[int]:
    """A request's content token ids: each message's content encoded, in order."""
    ids: list[int] = []
    for _role, content in request.messages:
        ids.extend(tokenizer.encode(content))
    return ids


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def write_mooncake(
    scenario: Scenario,
    salt: str,
    path: Path,
    *,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    server_url: str | None = None,
) -> dict[str, Any]:
    """Write ``scenario``'s requests as a Mooncake-style JSONL trace; returns counts.

    ``server_url`` is the replica whose ``/tokenize`` counts tokens when the scenario's
    ``model.tokenizer`` is ``server``.
    """
    spec = scenario.sessions
    if spec.history == "live":
        raise ScenarioError(
            scenario.source,
            "sessions.history",
            'expected "frozen" or "none" for export (live answers come from a server)',
        )
    if block_tokens < 1:
        raise ScenarioError(
            scenario.source, "--block-tokens", f"expected an integer >= 1, got {block_tokens}"
        )
    gen = generator_for(scenario.model.tokenizer, server_url=server_url, model=scenario.model.name)
    builder = SessionBuilder(scenario, salt, gen)
    sessions = builder.sessions()
    level = (scenario.load.levels or (1.0,))[0]
    # A trace scenario's own starts and delays; else the load's schedule (closed: all 0).
    offsets = builder.starts(level) or arrival_offsets(
        scenario.load, level, len(sessions), scenario.seed
    )
    order = sorted(range(len(sessions)), key=lambda i: (offsets[i], i))
    blocks = BlockIds(block_tokens)
    counts = {"requests": 0, "sessions": len(sessions), "input_tokens": 0, "blocks": 0}
    with_sessions = any(s.turns > 1 for s in sessions)

    def write(fh: IO[bytes]) -> None:
        for i in order:
            session = sessions[i]
            pauses = session.pauses()
            for req in session.requests():
                tokens = turn_tokens(gen.tokenizer, req)
                row: dict[str, Any] = {}
                if with_sessions:
                    row["session_id"] = session.session_id
                if req.turn == 1:
                    row["timestamp"] = _ms(offsets[i])
                else:
                    row["delay"] = _ms(pauses[req.turn - 1])
                row["input_length"] = len(tokens)
                row["output_length"] = req.max_tokens or spec.max_tokens
                row["hash_ids"] = blocks.of(tokens)
                fh.write(orjson.dumps(row) + b"\n")
                counts["requests"] += 1
                counts["input_tokens"] += len(tokens)
            session.forget()
        counts["blocks"] = len(blocks)

    atomic_write(ensure_dir(path.parent) / path.name, write)
    return counts
