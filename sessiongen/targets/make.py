"""Which target a replay uses: ``--endpoints``/``--cache``, else the scenario's ``[target]``.

Given replicas make one of three targets, by how their cache arm is set: stated once
for the whole run (``cache``: :class:`EndpointsTarget`), one pair per arm
(``endpoints_off``/``endpoints_on``: :class:`PairsTarget`), or set before every block
by the user's command (``switch_command``: :class:`SwitchedTarget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from sessiongen.errors import ScenarioError, UserError
from sessiongen.scenario.routerspec import RouterSpec
from sessiongen.scenario.spec import Scenario
from sessiongen.targets.base import Target
from sessiongen.targets.endpoints import EndpointsTarget
from sessiongen.targets.managed import ManagedTarget
from sessiongen.targets.pairs import PairsTarget
from sessiongen.targets.sim import SimTarget
from sessiongen.targets.switched import SwitchedTarget


class _Given(TypedDict):
    """What every target of given replicas takes from the scenario."""

    placements: tuple[str, ...]
    router: RouterSpec
    replica_header: str | None
    replica_names: tuple[str, ...]
    source: str


def make_target(
    scenario: Scenario, endpoints: Sequence[str] | None = None, cache: str | None = None
) -> Target:
    """The target named by ``endpoints``/``cache`` or the scenario's ``[target]``.

    Existing replicas (``endpoints``), or an existing router (``target.gateway``, placement
    ``gateway``) with or without them, make an :class:`EndpointsTarget`.
    """
    spec = scenario.target
    urls = list(endpoints or ()) or (list(spec.endpoints) if spec.kind == "endpoints" else [])
    common: _Given = {
        "placements": scenario.placement.policies,
        "router": spec.router,
        "replica_header": spec.replica_header,
        "replica_names": spec.replica_names,
        "source": scenario.source,
    }
    if spec.pairs:
        if endpoints or cache:
            flag = "--endpoints" if endpoints else "--cache"
            raise UserError(
                f"{flag}: not with --endpoints-off/--endpoints-on (each pair is one arm)"
            )
        return PairsTarget(
            list(spec.endpoints_off), list(spec.endpoints_on), scenario.model.name, **common
        )
    if spec.switch_command is not None:
        if cache:
            raise UserError("--cache: not with --switch-command (it sets each block's arm)")
        if not urls:
            raise UserError("--switch-command: give the pair it switches with --endpoints")
        _check_names(scenario, len(urls))
        return SwitchedTarget(
            urls,
            spec.switch_command,
            scenario.model.name,
            timeout_s=spec.switch_timeout_s,
            gateway=spec.gateway,
            **common,
        )
    if urls or spec.gateway:
        arm = cache or spec.cache
        if arm not in ("on", "off"):
            raise UserError(
                f"{'endpoints' if urls else 'a gateway'} given: state which cache arm the "
                "replicas are in with --cache on|off (or target.cache in the scenario)"
            )
        _check_names(scenario, len(urls))
        return EndpointsTarget(urls, arm, scenario.model.name, gateway=spec.gateway, **common)
    if spec.kind == "managed":
        return ManagedTarget(scenario)
    return SimTarget(scenario)


def _check_names(scenario: Scenario, n_urls: int) -> None:
    names = scenario.target.replica_names
    if names and len(names) != n_urls:
        raise ScenarioError(
            scenario.source,
            "target.replica_names",
            f"expected one name per endpoint ({n_urls}), got {len(names)}",
        )
