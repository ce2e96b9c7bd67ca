"""Which target a replay uses: ``--endpoints``/``--cache``, else the scenario's ``[target]``."""

from __future__ import annotations

from collections.abc import Sequence

from sessiongen.errors import UserError
from sessiongen.scenario.spec import Scenario
from sessiongen.targets.base import Target
from sessiongen.targets.endpoints import EndpointsTarget
from sessiongen.targets.managed import ManagedTarget
from sessiongen.targets.sim import SimTarget


def make_target(
    scenario: Scenario, endpoints: Sequence[str] | None = None, cache: str | None = None
) -> Target:
    """The target named by ``endpoints``/``cache`` or the scenario's ``[target]``."""
    spec = scenario.target
    urls = list(endpoints or ()) or (list(spec.endpoints) if spec.kind == "endpoints" else [])
    if urls:
        arm = cache or spec.cache
        if arm not in ("on", "off"):
            raise UserError(
                "endpoints given: state which cache arm they are in with --cache on|off "
                "(or target.cache in the scenario)"
            )
        return EndpointsTarget(urls, arm, scenario.model.name)
    if spec.kind == "managed":
        return ManagedTarget(scenario)
    return SimTarget(scenario)
