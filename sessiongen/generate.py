"""Write a scenario's requests as JSON lines, for inspection and for other tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from .errors import ScenarioError
from .records import atomic_write_bytes
from .scenario import Scenario
from .sessions import SessionBuilder


def write_jsonl(scenario: Scenario, salt: str, path: Path) -> dict[str, Any]:
    """One JSON object per (session, turn), session-major; returns counts written."""
    if scenario.sessions.history == "live":
        raise ScenarioError(
            scenario.source,
            "sessions.history",
            'expected "frozen" or "none" for generate (live answers come from a server)',
        )
    builder = SessionBuilder(scenario, salt)
    lines: list[bytes] = []
    tokens = 0
    sessions = builder.sessions()
    for session in sessions:
        for req in session.requests():
            tokens += req.content_tokens
            row = {
                "session_id": req.session_id,
                "turn": req.turn,
                "context_tokens": req.context_tokens,
                "content_tokens": req.content_tokens,
                "expected": req.expected,
                "body": req.body(scenario),
            }
            lines.append(orjson.dumps(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, b"\n".join(lines) + b"\n")
    return {"requests": len(lines), "sessions": len(sessions), "content_tokens": tokens}
