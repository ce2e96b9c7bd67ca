"""Routed placements and [target.router]: what validates, and one-line errors for the rest."""

from __future__ import annotations

import pytest

from sessiongen import scenario
from sessiongen.errors import ScenarioError, UserError
from sessiongen.scenario.routerspec import ROUTER_POLICIES, is_routed, router_policy
from sessiongen.targets import make_target
from sessiongen.targets.endpoints import EndpointsTarget
from sessiongen.targets.sim import SimTarget
from tests.support.paths import ROOT


def test_every_vllm_router_policy_is_a_placement() -> None:
    policies = [f"router:{p}" for p in ROUTER_POLICIES]
    sc = scenario.from_dict({"name": "r", "placement": {"policies": ["fixed", *policies]}})
    assert sc.placement.policies[1:] == tuple(policies)
    assert [router_policy(p) for p in sc.placement.policies] == [None, *ROUTER_POLICIES]
    assert not is_routed("alternate") and is_routed("gateway") and is_routed("router:random")


def test_router128k_compares_client_placements_and_three_router_policies() -> None:
    sc = scenario.load(ROOT / "scenarios/router128k.toml")
    assert sc.placement.policies == (
        "alternate",
        "fixed",
        "router:round_robin",
        "router:cache_aware",
        "router:consistent_hash",
    )
    assert sc.design.blocks == ("off", "on", "on", "off")
    assert sc.target.kind == "sim" and sc.target.router.session_header == "X-Session-ID"
    assert isinstance(make_target(sc), SimTarget)


def test_router_settings_stay_out_of_the_digest() -> None:
    base = scenario.from_dict({"name": "r"})
    other = scenario.from_dict(
        {"name": "r", "target": {"router": {"session_header": "X-User-ID", "retries": True}}}
    )
    assert base.digest() == other.digest()


@pytest.mark.parametrize(
    ("raw", "key", "message"),
    [
        ({"placement": {"policies": ["router:fastest"]}}, "placement.policies", "router:POLICY"),
        ({"placement": {"policies": ["router"]}}, "placement.policies", "got 'router'"),
        (
            {"target": {"router": {"session_header": "X Session"}}},
            "target.router.session_header",
            "HTTP header name",
        ),
        ({"target": {"gateway": "router:8000"}}, "target.gateway", "http(s)://host:port"),
        (
            {"target": {"endpoints": ["http://a:1"], "replica_names": ["a", "b"]}},
            "target.replica_names",
            "one name per endpoint",
        ),
    ],
)
def test_bad_router_settings_name_the_key(raw: dict[str, object], key: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=r"^r\.toml: ") as info:
        scenario.from_dict({"name": "r", **raw}, "r.toml")
    assert info.value.path == key and message in str(info.value)


def test_a_gateway_makes_an_endpoints_target_in_one_cache_arm() -> None:
    sc = scenario.from_dict(
        {
            "name": "r",
            "placement": {"policies": ["gateway"]},
            "target": {"gateway": "http://127.0.0.1:9/", "replica_header": "X-Served-By"},
        }
    )
    with pytest.raises(UserError, match="a gateway given: state which cache arm"):
        make_target(sc)
    target = make_target(sc, cache="on")
    assert isinstance(target, EndpointsTarget)
    assert target.urls == [] and target.routers.gateway == "http://127.0.0.1:9"
    assert target.served_by.header == "X-Served-By" and target.served_by.names == ()


def test_replica_names_are_checked_against_the_endpoints_given() -> None:
    sc = scenario.from_dict({"name": "r", "target": {"replica_names": ["a", "b"]}})
    with pytest.raises(UserError, match=r"one name per endpoint \(1\), got 2"):
        make_target(sc, endpoints=["http://127.0.0.1:9"], cache="on")
    target = make_target(sc, endpoints=["http://127.0.0.1:9", "http://127.0.0.1:10"], cache="on")
    assert isinstance(target, EndpointsTarget)
    assert target.served_by.fingerprint and target.served_by.names == ("a", "b")
