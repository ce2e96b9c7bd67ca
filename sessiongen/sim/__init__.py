"""The embedded simulated replica pair: a vLLM-like server with a shared-cache model.

Public entry points (imported lazily so that ``sessiongen.scenario.simprofile`` stays light for
the scenario schema):

- ``start_sim(profile, model_name, shared_cache) -> SimHandle``: replicas in a
  subprocess on free ports (``handle.urls``, ``handle.stop()``, a context manager);
- ``serve(profile, model_name, base_port, shared_cache, host)``: replicas in this
  process until interrupted (``sessiongen sim serve``);
- ``make_apps(profile, model_name, shared_cache)``: in-process aiohttp apps (tests);
- ``SimProfile``: every modeled parameter, calibrated from the study.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sessiongen.scenario.simprofile import SimProfile

if TYPE_CHECKING:
    from sessiongen.sim.process import SimHandle, serve, start_sim
    from sessiongen.sim.server import make_apps

__all__ = ["SimHandle", "SimProfile", "make_apps", "serve", "start_sim"]


def __getattr__(name: str) -> Any:
    if name in ("SimHandle", "serve", "start_sim"):
        from sessiongen.sim import process

        return getattr(process, name)
    if name == "make_apps":
        from sessiongen.sim.server import make_apps

        return make_apps
    raise AttributeError(f"module 'sessiongen.sim' has no attribute {name!r}")
