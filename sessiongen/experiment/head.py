"""The run head (the manifest as a run starts) and a block's entry, built once.

A replay and a plan write the same manifest: the scenario as resolved, seeds and salt,
the tokenizer and text generator, the tool and the host, the target as it describes
itself, the blocks' order. Each block adds its entry as it starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from sessiongen.design.blocks import BlockPlan
from sessiongen.records import io
from sessiongen.records.format import (
    SCHEMA_VERSION,
    BlockEntry,
    BlockOrder,
    Manifest,
    TargetInfo,
)
from sessiongen.scenario.spec import Scenario


def run_head(
    scenario: Scenario,
    *,
    run_id: str,
    salt: str,
    tokenizer: str,
    text_generator: str,
    target: TargetInfo,
    plan: Sequence[BlockPlan] = (),
) -> Manifest:
    """The manifest of a run that starts now: incomplete, no block run yet."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "scenario_name": scenario.name,
        "scenario_source": scenario.source,
        "scenario": scenario.to_dict(),
        "scenario_digest": scenario.digest(),
        "seed": scenario.seed,
        "salt": salt,
        "tokenizer": tokenizer,
        "text_generator": text_generator,
        "tool": io.tool_identity(),
        "host": io.host_facts(),
        "target": target,
        "block_order": block_order(plan),
        "blocks": [],
        "started_at": io.now_iso(),
        "ended_at": None,
        "complete": False,
    }


def block_order(plan: Sequence[BlockPlan]) -> list[BlockOrder]:
    """The manifest's ``block_order``: each block's placement and cache arm."""
    return [{"placement": b.placement, "cache": b.cache} for b in plan]


def block_entry(plan: BlockPlan, *, salt: str, status: str) -> BlockEntry:
    """A block's manifest entry as it starts (``status``: what it is if nothing follows)."""
    return {
        "block": plan.block,
        "placement": plan.placement,
        "cache": plan.cache,
        "block_in_placement": plan.block_in_placement,
        "salt": salt,
        "status": status,
        "started_at": io.now_iso(),
    }
