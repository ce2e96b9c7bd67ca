"""The blocks of a run (a replay or a plan): which run, in which order, on which cache arm
and load level (:func:`~.load.load_levels`)."""

from __future__ import annotations

from dataclasses import dataclass

from sessiongen.design.load import load_levels
from sessiongen.errors import ScenarioError
from sessiongen.scenario.spec import Scenario


@dataclass(frozen=True)
class BlockPlan:
    """One block of a replay: its place in the run, placement, load level and cache arm."""

    block: int  # index in execution order, 0-based, across placements
    placement: str
    cache: str  # off | on
    block_in_placement: int  # 0..len(design.blocks)-1 within its placement and level
    level: float | None = 1.0  # concurrency (closed loop), start rate (open loop), None (trace)


def plan_blocks(scenario: Scenario, runnable: list[str]) -> list[BlockPlan]:
    """Per placement, per load level, the design's blocks in order, keeping those the
    target can run (``runnable``: the design's blocks as filtered by the target); a
    :class:`ScenarioError` if none can."""
    plan = [
        (policy, level, cache, i)
        for policy in scenario.placement.policies
        for level in load_levels(scenario)
        for i, cache in enumerate(runnable)
    ]
    if not plan:
        raise ScenarioError(
            scenario.source, "design.blocks", "no block can run on this target's cache arm"
        )
    return [
        BlockPlan(n, policy, cache, i, level) for n, (policy, level, cache, i) in enumerate(plan)
    ]
