"""Which ``[sessions]`` keys apply to which source of sessions, and the refusal of the rest.

The synthetic builder reads every ``[sessions]`` key; a trace (``source = "trace"``) and a
conversation dataset (``"sharegpt"``) set their own sessions, turns and prompts, so the
keys that shape synthetic sessions would be ignored there (``--set sessions.count=50`` on
a trace used to change nothing, silently). :func:`check_applies` refuses such a key at
validation, one line naming it and what sets that instead. A key counts as given when it
differs from its default (validation sees values, not the file), so ``count = 4`` written
out on a trace passes, and changes nothing either way.

Kept on every source: ``answer_tokens`` and ``output_tokens`` (the warm-ups' ``max_tokens``,
and a dataset turn's where its answer is missing or ``output_tokens = "scenario"``), and
``history`` on a dataset. ``[sessions.trace]`` applies only to a trace and
``[sessions.sharegpt]`` only to a dataset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Per source, the keys its builder ignores and what sets them instead.
IGNORED: dict[str, dict[str, str]] = {
    "trace": {
        "count": "the trace sets its sessions; sessions.trace.limit or window_ms selects them",
        "turns": "the trace sets each session's turns",
        "initial_context_tokens": "each line of the trace is a whole prompt",
        "question_tokens": "each line of the trace is a whole prompt",
        "history": "each line of the trace is a whole prompt; no answer is appended",
        "think_time_s": "the trace's timestamps and delays set the pauses",
        "think": "the trace's timestamps and delays set the pauses",
        "think_sigma": "the trace's timestamps and delays set the pauses",
        "probe": "probes are synthetic-only",
        "shared_prefix_tokens": "the trace's hash ids say what its prompts share",
    },
    "sharegpt": {
        "count": "the dataset sets its sessions; sessions.sharegpt.limit caps them",
        "turns": "each conversation sets its turns; sessions.sharegpt.max_turns caps them",
        "initial_context_tokens": "the conversations set their prompts; "
        "sessions.sharegpt.pad_first_to pads the first turn",
        "question_tokens": "the dataset's questions are sent as they are",
        "probe": "probes are synthetic-only",
        "shared_prefix_tokens": "the dataset's system turns are its shared prompt",
    },
}
#: The nested tables and the one source each belongs to.
TABLES = {"trace": "trace", "sharegpt": "sharegpt"}
_NAMES = {"synthetic": "synthetic", "trace": "trace", "sharegpt": "sharegpt"}


def _defaults(value: Any) -> dict[str, object]:
    """The field defaults of dataclass ``value`` (read from the fields, not by building
    one: building a default ``[sessions]`` would run this check again)."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(value):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _changed(value: Any) -> list[str]:
    """The fields of dataclass ``value`` that differ from their defaults."""
    return [k for k, v in _defaults(value).items() if getattr(value, k) != v]


def check_applies(sessions: Any) -> None:
    """Raise ``ValueError("key: does not apply to a SOURCE source (why)")`` for the first
    ``[sessions]`` key given (not at its default) that ``sessions.source`` ignores."""
    source = sessions.source
    name = _NAMES.get(source, source)
    changed = set(_changed(sessions))
    for key, why in IGNORED.get(source, {}).items():
        if key in changed:
            raise ValueError(f"{key}: does not apply to a {name} source ({why})")
    for table, owner in TABLES.items():
        if owner == source:
            continue
        changed_keys = _changed(getattr(sessions, table))
        if changed_keys:
            raise ValueError(
                f"{table}.{changed_keys[0]}: does not apply to a {name} source "
                f'([sessions.{table}] is read only with sessions.source = "{owner}")'
            )
