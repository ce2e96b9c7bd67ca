"""Which target a replay uses: ``--endpoints``/``--cache``, else the scenario's ``[target]``."""

from __future__ import annotations

from collections.abc import Sequence

from sessiongen.errors import ScenarioError, UserError
from sessiongen.scenario.spec import Scenario
from sessiongen.targets.base import Target
from sessiongen.targets.endpoints import EndpointsTarget
from sessiongen.targets.managed import ManagedTarget
from sessiongen.targets.sim import SimTarget


def make_target(
    scenario: Scenario, endpoints: Sequence[str] | None = None, cache: str | None = None
) -> Target:
    """The target named by ``endpoints``/``cache`` or the scenario's ``[target]``.

    Existing replicas (``endpoints``), or an existing router (``target.gateway``, placement
    ``gateway``) with or without them, make an :class:`EndpointsTarget`.
    """
    spec = scenario.target
    urls = list(endpoints or ()) or (list(spec.endpoints) if spec.kind == "endpoints" else [])
    if urls or spec.gateway:
        arm = cache or spec.cache
        if arm not in ("on", "off"):
            raise UserError(
                f"{'endpoints' if urls else 'a gateway'} given: state which cache arm the "
                "replicas are in with --cache on|off (or target.cache in the scenario)"
            )
        if spec.replica_names and len(spec.replica_names) != len(urls):
            raise ScenarioError(
                scenario.source,
                "target.replica_names",
                f"expected one name per endpoint ({len(urls)}), got {len(spec.replica_names)}",
            )
        return EndpointsTarget(
            urls,
            arm,
            scenario.model.name,
            gateway=spec.gateway,
            placements=scenario.placement.policies,
            router=spec.router,
            replica_header=spec.replica_header,
            replica_names=spec.replica_names,
            source=scenario.source,
        )
    if spec.kind == "managed":
        return ManagedTarget(scenario)
    return SimTarget(scenario)
