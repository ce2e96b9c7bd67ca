"""Write a scenario's requests as JSON lines, for inspection and for other tools."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import orjson

from sessiongen.errors import ScenarioError
from sessiongen.infra.files import atomic_write, ensure_dir
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.sessions import SessionBuilder
from sessiongen.workload.textgen import generator_for


def write_jsonl(
    scenario: Scenario, salt: str, path: Path, server_url: str | None = None
) -> dict[str, Any]:
    """One JSON object per (session, turn), session-major; returns counts written.

    ``server_url`` is the replica whose ``/tokenize`` counts tokens when the scenario's
    ``model.tokenizer`` is ``server``.
    """
    if scenario.sessions.history == "live":
        raise ScenarioError(
            scenario.source,
            "sessions.history",
            'expected "frozen" or "none" for generate (live answers come from a server)',
        )
    gen = generator_for(scenario.model.tokenizer, server_url=server_url, model=scenario.model.name)
    builder = SessionBuilder(scenario, salt, gen)
    sessions = builder.sessions()
    counts = {"requests": 0, "sessions": len(sessions), "content_tokens": 0}

    def write(fh: IO[bytes]) -> None:
        # Session by session, line by line: the file may be far larger than memory.
        for session in sessions:
            for req in session.requests():
                counts["requests"] += 1
                counts["content_tokens"] += req.content_tokens
                row = {
                    "session_id": req.session_id,
                    "turn": req.turn,
                    "context_tokens": req.context_tokens,
                    "content_tokens": req.content_tokens,
                    "expected": req.expected,
                    "body": req.body(scenario),
                }
                fh.write(orjson.dumps(row) + b"\n")
            session.forget()

    atomic_write(ensure_dir(path.parent) / path.name, write)
    return counts
