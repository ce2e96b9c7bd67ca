"""Endpoints that say they are simulated: what the run is labelled and measured in."""

from __future__ import annotations

from typing import Any

import pytest

from sessiongen.errors import EndpointError
from sessiongen.records.meta import RunMeta
from sessiongen.targets.endpoints import Simulation, simulation


def server(url: str, version: Any, *, gateway: bool = False) -> dict[str, Any]:
    return {"url": url, "version": version, "gateway": gateway}


SIM = {"version": "sessiongen-sim 0.1.0", "simulated": True, "time_scale": 0.05}
VLLM = {"version": "0.9.2"}


def meta(sim: Simulation) -> RunMeta:
    return RunMeta.from_manifest({"target": {"kind": "endpoints", **sim.describe()}})


def test_replicas_that_say_they_are_simulated_give_their_time_scale() -> None:
    sim = simulation([server("http://a", SIM), server("http://b", {**SIM, "replica": 1})])
    assert sim == Simulation(simulated=True, time_scale=0.05)
    parsed = meta(sim)
    assert parsed.simulated and parsed.modeled and parsed.time_scale == 0.05
    assert parsed.target_label == "SIMULATED (endpoints)"
    assert parsed.seconds == "modeled seconds"


def test_real_replicas_are_not_simulated_whatever_the_gateway_says() -> None:
    for version in (VLLM, None, {"simulated": "yes"}):
        sim = simulation([server("http://a", version), server("http://gw", SIM, gateway=True)])
        assert sim == Simulation()
        parsed = meta(sim)
        assert not parsed.simulated and parsed.time_scale == 1.0
        assert parsed.seconds == "seconds" and parsed.target_label == "endpoints"


def test_a_gateway_alone_speaks_for_its_replicas() -> None:
    assert simulation([server("http://gw", SIM, gateway=True)]).simulated


def test_simulated_replicas_without_a_time_scale_keep_measured_seconds() -> None:
    sim = simulation([server("http://a", {"simulated": True, "time_scale": True})])
    assert sim == Simulation(simulated=True, time_scale=None)
    parsed = meta(sim)
    assert parsed.simulated and not parsed.modeled and parsed.time_scale == 1.0
    assert parsed.seconds == "seconds" and parsed.target_label == "SIMULATED (endpoints)"


def test_replicas_of_two_kinds_or_two_time_scales_are_refused() -> None:
    with pytest.raises(EndpointError, match=r"http://a: says it is simulated.*http://b does not"):
        simulation([server("http://a", SIM), server("http://b", VLLM)])
    other = {**SIM, "time_scale": 1.0}
    with pytest.raises(EndpointError, match=r"http://a: time scale 0\.05 and http://b: 1 "):
        simulation([server("http://a", SIM), server("http://b", other)])


def test_older_manifests_keep_their_meaning() -> None:
    old_sim = RunMeta.from_manifest({"target": {"kind": "sim", "time_scale": 0.1}})
    assert old_sim.simulated and old_sim.modeled and old_sim.seconds == "modeled seconds"
    old_real = RunMeta.from_manifest({"target": {"kind": "endpoints", "simulated": False}})
    assert not old_real.modeled and old_real.seconds == "seconds"
