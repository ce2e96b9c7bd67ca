"""A trace as the replay's sessions: which lines are turns of which session, when each
is sent, and what each shares with the requests before it.

The rules, in the order the reader gives the lines (:mod:`.trace`):

- **Sessions.** With ``session_id``, a session's turns are its lines in file order;
  a line without one is a one-turn session of its own (id ``trace-line-N``). Sessions
  are ordered by their first line, so the replay's session index follows the file.
- **Prompts.** Each line is a whole prompt, as in Mooncake's traces: the answer of a
  turn is not appended to the next one, whose hash ids already say what it is. The
  prompt text is :class:`~.traceprompts.TracePrompts`' (token-exact); ``max_tokens``
  is the line's ``output_length``.
- **Times** (modeled seconds; the reader has already taken the first timestamp as 0
  and divided by ``speedup``). A session's first turn is sent at its timestamp, whatever
  the replicas' state (open loop across sessions). A later turn is sent ``delay`` after
  the previous turn's answer (closed loop within a session); a later turn with a
  timestamp and no delay waits the gap between its timestamp and that of the latest
  earlier turn of its session that has one (never below 0).
- **Sharing.** Each request carries its :class:`~.reuse.PrefixFacts` (leading blocks
  seen in earlier requests of the kept trace, reuse distance in blocks), computed over
  the kept requests in file order.

A request whose prompt and output cannot fit the model's context (``max_model_len``
of the simulated pair or of managed replicas; endpoints say nothing, so nothing is
checked) is refused here, with the count and the longest, before anything is sent.

A process parses a trace file once for the same settings (:func:`load_sessions` keeps
the last few, keyed by the file's path and a digest of its bytes): a plan's cache arms,
configurations and replicates all replay the same sessions.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario
from sessiongen.workload.reuse import PrefixFacts, prefix_facts
from sessiongen.workload.trace import TraceRequest, read_trace


class TraceTurn(NamedTuple):
    """One line of the trace as a turn: the request, its sharing facts, its pause."""

    request: TraceRequest
    facts: PrefixFacts
    pause_s: float  # modeled seconds after the previous turn's answer (0 for a first turn)


class TraceSession(NamedTuple):
    """A session of the trace: its id, when its first turn is sent, its turns in order."""

    session_id: str
    start_s: float
    turns: tuple[TraceTurn, ...]


def trace_sessions(requests: Iterable[TraceRequest], block_tokens: int) -> list[TraceSession]:
    """The trace's sessions (see the module doc), in the order of their first lines."""
    turns: dict[str, list[TraceTurn]] = {}
    starts: dict[str, float] = {}
    last_ts: dict[str, float] = {}
    for req, facts in prefix_facts(requests, block_tokens):
        key = req.session_id if req.session_id is not None else f"trace-line-{req.line}"
        if key not in turns:
            assert req.timestamp_ms is not None  # the reader insists on it for a first turn
            turns[key], starts[key] = [], req.timestamp_ms / 1000
            pause = 0.0
        elif req.delay_ms is not None:
            pause = req.delay_ms / 1000
        else:
            assert req.timestamp_ms is not None  # a later turn has a delay or a timestamp
            pause = max(0.0, (req.timestamp_ms - last_ts[key]) / 1000)
        if req.timestamp_ms is not None:
            last_ts[key] = req.timestamp_ms
        turns[key].append(TraceTurn(req, facts, pause))
    return [TraceSession(key, starts[key], tuple(ts)) for key, ts in turns.items()]


def context_limit(scenario: Scenario) -> int | None:
    """The model's context length as the scenario states it, or None (endpoints)."""
    target = scenario.target
    if target.kind == "sim":
        return target.sim.max_model_len
    if target.kind == "managed":
        return target.managed.max_model_len
    return None


def check_context(sessions: Iterable[TraceSession], limit: int | None, source: str) -> None:
    """A one-line :class:`ScenarioError` when some prompt plus its output exceeds ``limit``.

    The prompt is counted as the trace's ``input_length``: a chat template adds a few
    tokens on the server, so a request within a handful of tokens of the limit may still
    be refused there.
    """
    if limit is None:
        return
    over = [
        t.request
        for s in sessions
        for t in s.turns
        if t.request.input_length + t.request.output_length > limit
    ]
    if not over:
        return
    longest = max(over, key=lambda r: r.input_length + r.output_length)
    raise ScenarioError(
        source,
        "sessions.trace",
        f"{len(over)} requests need more than the model's max_model_len = {limit} tokens "
        f"(input_length + output_length); the longest needs "
        f"{longest.input_length + longest.output_length} (line {longest.line})",
    )


def load_sessions(scenario: Scenario) -> list[TraceSession]:
    """The scenario's trace read (``[sessions.trace]``) and made into sessions, checked
    against the model's context length; read once a process for the same file and
    settings (the module doc)."""
    spec = scenario.sessions.trace
    path = spec.path(scenario.source)
    settings = (spec.block_tokens, spec.limit, spec.window(), spec.speedup)
    limit = context_limit(scenario)
    try:
        digest = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    except OSError:  # the reader's own one-line error names the file
        return list(_read_sessions(path, settings, limit))
    return list(_read_cached(path, digest, settings, limit))


_Settings = tuple[int, int | None, float | tuple[float, float] | None, float]


@functools.lru_cache(maxsize=4)
def _read_cached(
    path: Path, digest: str, settings: _Settings, limit: int | None
) -> tuple[TraceSession, ...]:
    """:func:`_read_sessions` of the file whose bytes have this digest."""
    return _read_sessions(path, settings, limit)


def _read_sessions(path: Path, settings: _Settings, limit: int | None) -> tuple[TraceSession, ...]:
    block_tokens, most, window, speedup = settings
    requests = read_trace(
        path, block_tokens=block_tokens, limit=most, window=window, speedup=speedup
    )
    sessions = trace_sessions(requests, block_tokens)
    check_context(sessions, limit, str(path))
    return tuple(sessions)
