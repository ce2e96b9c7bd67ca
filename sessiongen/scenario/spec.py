"""Scenario files: TOML in, one frozen, validated :class:`Scenario` out.

A scenario says what sessions to build (``[model]``, ``[sessions]``, ``[sampling]``),
how to replay them (``[placement]``, ``[design]``, ``[driver]``) and against what
(``[target]``, with ``[target.sim]`` for the embedded simulated pair and
``[target.managed]`` for real vLLM + LMCache replicas that sessiongen starts itself).
See ``scenarios/*.toml`` for commented examples.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from sessiongen.errors import ScenarioError
from sessiongen.infra.tomlfile import read_toml
from sessiongen.scenario import schema
from sessiongen.scenario.routerspec import (
    GATEWAY,
    ROUTER_POLICIES,
    RouterSpec,
    check_header_name,
    router_policy,
)
from sessiongen.scenario.schema import spec
from sessiongen.scenario.simprofile import SimProfile

PLACEMENT_RE = re.compile(r"^(alternate|fixed|random|move-at:([1-9][0-9]*))$")


def _check_name(value: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        return "expected letters, digits, '_', '.', '-' (at most 64, no spaces)"
    return None


def _check_policies(value: tuple[str, ...]) -> str | None:
    if not value:
        return "expected at least one placement policy"
    for item in value:
        if router_policy(item) in ROUTER_POLICIES or item == GATEWAY:
            continue
        if not PLACEMENT_RE.match(item):
            return (
                "expected policies among alternate, fixed, random, move-at:K (K >= 1), "
                f"gateway, router:POLICY (POLICY: {', '.join(ROUTER_POLICIES)}), got {item!r}"
            )
    if len(set(value)) != len(value):
        return "expected each policy once"
    return None


def _check_nonempty_unique(value: tuple[str, ...]) -> str | None:
    if not value:
        return "expected a non-empty list"
    if len(set(value)) != len(value):
        return "expected each entry once"
    return None


def _check_tokenizer(value: str) -> str | None:
    if value in ("cl100k", "server") or value.endswith(".json"):
        return None
    return 'expected "cl100k", "server" or a path to a tokenizer.json'


@dataclass(frozen=True)
class ModelSpec:
    """What to call the model and how to count its tokens."""

    name: str = spec("sim-27b", doc="served model name sent in every request")
    api: Literal["chat", "completions"] = spec("chat", doc="OpenAI API flavour")
    tokenizer: str = spec(
        "cl100k",
        check=_check_tokenizer,
        doc='"cl100k" (offline), a tokenizer.json path, or "server" (POST /tokenize)',
    )


@dataclass(frozen=True)
class SessionsSpec:
    """The synthetic multi-turn sessions."""

    count: int = spec(4, ge=1, le=100_000, doc="sessions per arm (per context size)")
    turns: int = spec(6, ge=1, le=1000, doc="turns per session")
    initial_context_tokens: tuple[int, ...] = spec(
        (32768,),
        ge=16,
        le=10_000_000,
        one_or_many=True,
        doc="context block size(s) of turn 1, tokens",
    )
    question_tokens: int = spec(55, ge=8, le=1_000_000, doc="tokens per user question")
    answer_tokens: int = spec(1000, ge=1, le=1_000_000, doc="tokens per frozen assistant answer")
    output_tokens: int | None = spec(
        None, ge=1, doc="max_tokens per request (default: answer_tokens)"
    )
    history: Literal["frozen", "live", "none"] = spec(
        "frozen",
        doc="frozen: pre-written answers; live: real answers fed back; "
        "none: every turn re-sends the context with a new question (probe chains)",
    )
    think_time_s: float = spec(0.0, ge=0, doc="pause between turns, modeled seconds")
    probe: Literal["none", "needle", "equivalence"] = spec("none", doc="correctness probe")
    shared_prefix_tokens: int = spec(
        0, ge=0, le=10_000_000, doc="tokens of a system prompt shared by all sessions (0: none)"
    )

    @property
    def max_tokens(self) -> int:
        """The ``max_tokens`` each request asks for."""
        return self.output_tokens if self.output_tokens is not None else self.answer_tokens


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling fields sent with every request."""

    temperature: float = spec(0.0, ge=0, le=2)
    seed: int = spec(0, ge=0)
    ignore_eos: bool = spec(True, doc="ask for exactly max_tokens tokens (vLLM extension)")


@dataclass(frozen=True)
class PlacementSpec:
    """Which placement policies to run, each as its own set of arms."""

    policies: tuple[str, ...] = spec(
        ("alternate", "fixed"),
        check=_check_policies,
        doc="alternate | fixed | random | move-at:K (the client picks the replica); "
        "router:POLICY (a vllm-router started per block) | gateway (target.gateway) "
        "(a router picks it; see [target.router])",
    )


@dataclass(frozen=True)
class DesignSpec:
    """The experiment design: cache arms and the block order per placement."""

    cache: tuple[Literal["off", "on"], ...] = spec(
        ("off", "on"), check=_check_nonempty_unique, doc="cache arms"
    )
    blocks: tuple[Literal["off", "on"], ...] = spec(
        ("off", "on", "on", "off"), doc="block order for each placement policy"
    )
    warmup_requests: int = spec(2, ge=0, doc="warm-up requests per replica before each block")
    warmup_tokens: int | None = spec(
        None,
        ge=64,
        le=1_000_000,
        doc="context tokens of each warm-up (default: two of the target's pool chunks, "
        "so the shared pool stores and serves something before any measured request)",
    )
    restart_between_blocks: bool = spec(True, doc="fresh replicas for each block when possible")

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ValueError("blocks: expected a non-empty list")
        missing = sorted(set(self.blocks) - set(self.cache))
        if missing:
            raise ValueError(f"blocks: uses arm {missing[0]!r} not in design.cache")


@dataclass(frozen=True)
class DriverSpec:
    """How the client drives the replicas."""

    concurrency: int = spec(4, ge=1, le=100_000, doc="sessions in flight at once")
    request_timeout_s: float = spec(900.0, gt=0, doc="stall limit per request, wall seconds")
    connect_timeout_s: float = spec(10.0, gt=0)


@dataclass(frozen=True)
class ManagedSpec:
    """Real vLLM replicas plus one LMCache server that sessiongen starts and stops."""

    device: Literal["cuda", "cpu"] = spec("cpu")
    model: str = spec("builtin:tiny", doc='HF id, local dir, or "builtin:tiny" (random weights)')
    vllm_args: tuple[str, ...] = spec((), doc="extra arguments for every vLLM replica")
    replicas: int = spec(2, ge=1, le=64)
    gpus_per_replica: int = spec(1, ge=1)
    base_port: int = spec(0, ge=0, le=65000, doc="replica i on base_port+i (0: free ports)")
    lmcache_port: int = spec(0, ge=0, le=65535, doc="LMCache server port (0: a free port)")
    pool_size_gb: float = spec(3.0, gt=0, doc="LMCache L1 pool size, GB")
    chunk_size: int = spec(256, ge=1, doc="LMCache chunk size, tokens")
    eviction: str = spec("LRU", doc="LMCache eviction policy")
    max_model_len: int = spec(65536, ge=256)
    startup_timeout_s: float = spec(900.0, gt=0)
    env: dict[str, str] = spec({}, doc="extra environment for every process")


@dataclass(frozen=True)
class TargetSpec:
    """Where requests go: the embedded simulator, given endpoints, or managed replicas."""

    kind: Literal["sim", "endpoints", "managed"] = spec("sim")
    endpoints: tuple[str, ...] = spec((), doc="base URLs of existing OpenAI-compatible replicas")
    cache: Literal["on", "off"] | None = spec(
        None, doc="which cache arm the given endpoints are in (kind = endpoints)"
    )
    gateway: str | None = spec(
        None, doc="an existing router's base URL: placement gateway sends every turn there"
    )
    replica_header: str | None = spec(
        None,
        check=check_header_name,
        doc="kind = endpoints: a response header naming the replica that served a request",
    )
    replica_names: tuple[str, ...] = spec(
        (),
        doc="kind = endpoints: what each endpoint calls itself in replica_header or in "
        "system_fingerprint, in endpoints order (default: its index, or its URL)",
    )
    sim: SimProfile = field(default_factory=SimProfile)
    managed: ManagedSpec = field(default_factory=ManagedSpec)
    router: RouterSpec = field(default_factory=RouterSpec)

    def __post_init__(self) -> None:
        if self.kind == "endpoints" and not (self.endpoints or self.gateway):
            raise ValueError(
                "endpoints: expected at least one URL (or a gateway) when kind = endpoints"
            )
        urls = [("endpoints", url) for url in self.endpoints]
        urls += [("gateway", self.gateway)] if self.gateway is not None else []
        for key, url in urls:
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"{key}: expected http(s)://host:port, got {url!r}")
        if self.endpoints and self.replica_names and len(self.replica_names) != len(self.endpoints):
            raise ValueError("replica_names: expected one name per endpoint")


@dataclass(frozen=True)
class Scenario:
    """A whole scenario as resolved (file plus overrides), validated once."""

    name: str = spec(check=_check_name)
    seed: int = spec(0, ge=0)
    description: str = spec("")
    model: ModelSpec = field(default_factory=ModelSpec)
    sessions: SessionsSpec = field(default_factory=SessionsSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    design: DesignSpec = field(default_factory=DesignSpec)
    driver: DriverSpec = field(default_factory=DriverSpec)
    target: TargetSpec = field(default_factory=TargetSpec)
    source: str = spec("<memory>", doc="file the scenario came from (set by the loader)")

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario as plain data (for manifests and hashing)."""
        data: dict[str, Any] = schema.to_plain(self)
        data.pop("source", None)
        return data

    def digest(self) -> str:
        """A short hash of what the sessions and design depend on (not the target)."""
        data = self.to_dict()
        data.pop("target", None)
        data.pop("description", None)
        return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def from_dict(
    raw: dict[str, Any], source: str = "<memory>", overrides: Sequence[str] = ()
) -> Scenario:
    """Validate plain data (plus ``dotted.key=value`` overrides) into a :class:`Scenario`."""
    data = schema.apply_overrides(raw, list(overrides))
    if "source" in data:
        raise ScenarioError(source, "source", "unknown key (it is set by the loader)")
    data["source"] = source
    return schema.build(Scenario, data, source)


def load(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read a scenario TOML file, apply overrides, validate; errors name file and key."""
    return from_dict(read_toml(path), source=str(path), overrides=overrides)
