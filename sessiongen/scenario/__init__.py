"""Scenario files: TOML in, one frozen, validated :class:`Scenario` out.

- :mod:`.schema`: plain TOML data -> frozen dataclasses, one-line errors naming file and key;
- :mod:`.spec`: the scenario's sections (``[model]``, ``[sessions]``, ...) and :func:`load`;
- :mod:`.simprofile`: ``[target.sim]``, the simulated replicas' timing profile;
- :mod:`.routerspec`: routed placements and ``[target.router]`` (what routers key on);
- :mod:`.tracespec`: ``[sessions.trace]``, the trace a scenario takes its requests from;
- :mod:`.sharegptspec`: ``[sessions.sharegpt]``, the conversation dataset sessions come from.
"""

from sessiongen.scenario.simprofile import SimProfile
from sessiongen.scenario.spec import (
    DesignSpec,
    DriverSpec,
    ManagedSpec,
    ModelSpec,
    PlacementSpec,
    SamplingSpec,
    Scenario,
    SessionsSpec,
    TargetSpec,
    from_dict,
    load,
)

__all__ = [
    "DesignSpec",
    "DriverSpec",
    "ManagedSpec",
    "ModelSpec",
    "PlacementSpec",
    "SamplingSpec",
    "Scenario",
    "SessionsSpec",
    "SimProfile",
    "TargetSpec",
    "from_dict",
    "load",
]
