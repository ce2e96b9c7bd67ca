"""``[sessions.sharegpt]``: the conversation dataset a scenario takes its sessions from.

``sessions.source = "sharegpt"`` names a ShareGPT-shaped dataset instead of the synthetic
session builder::

    [sessions]
    source = "sharegpt"
    history = "frozen"                    # the dataset's answers (or "live": the model's)

    [sessions.sharegpt]
    file = "conversations/sharegpt-small.json"  # JSON list or JSONL; relative: the
                                          # working dir, else beside the scenario
    min_turns = 2                         # drop conversations with fewer human turns
    max_turns = 8                         # keep at most the first 8 human turns
    max_context_tokens = 32768            # keep turns while prompt + output fit this
    pad_first_to = 32768                  # first turn padded to this many tokens
    limit = 100                           # at most this many conversations (after the rest)
    output_tokens = "answer"              # max_tokens: the dataset answer's length, or
                                          # "scenario" (sessions.output_tokens / answer_tokens)

This module is pure data (the reader is :mod:`sessiongen.workload.sharegpt`), so the
scenario schema embeds it without importing the workload; the file is read when the
sessions are built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sessiongen.scenario.schema import spec


@dataclass(frozen=True)
class ShareGPTSpec:
    """Which conversations of the dataset become sessions, and how they are shaped."""

    file: str = spec("", doc="ShareGPT-shaped JSON or JSONL (needed for source = sharegpt)")
    min_turns: int = spec(1, ge=1, le=100_000, doc="drop conversations with fewer human turns")
    max_turns: int | None = spec(None, ge=1, doc="keep at most this many human turns (none: all)")
    max_context_tokens: int | None = spec(
        None,
        ge=16,
        le=10_000_000,
        doc="keep a conversation's turns while prompt + max_tokens fit (none: no cap)",
    )
    pad_first_to: int | None = spec(
        None,
        ge=16,
        le=10_000_000,
        doc="pad the first turn's prompt with generated prose to this many tokens (none: no pad)",
    )
    limit: int | None = spec(None, ge=1, doc="at most this many conversations (none: all)")
    output_tokens: Literal["answer", "scenario"] = spec(
        "answer",
        doc="max_tokens per turn: answer (the dataset answer's tokens) | scenario "
        "(sessions.output_tokens, else answer_tokens)",
    )

    def __post_init__(self) -> None:
        if self.max_turns is not None and self.max_turns < self.min_turns:
            raise ValueError(
                f"max_turns: expected >= min_turns = {self.min_turns}, got {self.max_turns}"
            )

    def path(self, scenario_source: str) -> Path:
        """The dataset: as given if it exists (or is absolute), else beside the scenario."""
        path = Path(self.file)
        if path.is_absolute() or path.exists():
            return path
        beside = Path(scenario_source).parent / path
        return beside if beside.exists() else path


def check_sharegpt_source(source: str, sharegpt: ShareGPTSpec) -> None:
    """``sessions.source = "sharegpt"`` needs ``[sessions.sharegpt] file``."""
    if source == "sharegpt" and not sharegpt.file:
        raise ValueError('sharegpt.file: missing; expected a dataset file for source = "sharegpt"')
