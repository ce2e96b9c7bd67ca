"""The plan of a replay: which blocks run, in which order, on which cache arm."""

from __future__ import annotations

from dataclasses import dataclass

from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario


@dataclass(frozen=True)
class BlockPlan:
    """One block of a replay: its place in the run, its placement and its cache arm."""

    block: int  # index in execution order, 0-based, across placements
    placement: str
    cache: str  # off | on
    block_in_placement: int  # 0..len(design.blocks)-1 within its placement


def plan_blocks(scenario: Scenario, runnable: list[str]) -> list[BlockPlan]:
    """Every placement's blocks in order, keeping those the target can run (``runnable``:
    the design's blocks as filtered by the target); a :class:`ScenarioError` if none."""
    plan = [
        BlockPlan(0, policy, cache, i)
        for policy in scenario.placement.policies
        for i, cache in enumerate(runnable)
    ]
    if not plan:
        raise ScenarioError(
            scenario.source, "design.blocks", "no block can run on this target's cache arm"
        )
    return [BlockPlan(n, p.placement, p.cache, p.block_in_placement) for n, p in enumerate(plan)]
