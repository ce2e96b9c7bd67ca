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
from typing import Literal, get_args

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
from sessiongen.scenario.sharegptspec import ShareGPTSpec, check_sharegpt_source
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.scenario.sourcekeys import check_applies
from sessiongen.scenario.tracespec import TraceSpec, check_source

PLACEMENT_RE = re.compile(r"^(alternate|fixed|random|move-at:([1-9][0-9]*))$")


def _check_name(value: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        return "expected letters, digits, '_', '.', '-' (at most 64, no spaces)"
    return None


def _check_policies(value: tuple[str, ...]) -> str | None:
    for item in value:
        if router_policy(item) in ROUTER_POLICIES or item == GATEWAY:
            continue
        if not PLACEMENT_RE.match(item):
            return (
                "expected policies among alternate, fixed, random, move-at:K (K >= 1), "
                f"gateway, router:POLICY (POLICY: {', '.join(ROUTER_POLICIES)}), got {item!r}"
            )
    return None


def _check_env(value: dict[str, str]) -> str | None:
    for name in value:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            return (
                f"expected environment variable names (letters, digits, '_') as keys, not {name!r}"
            )
    return None


def _check_switch_command(value: str | None) -> str | None:
    if value is not None and "{arm}" not in value:
        return "expected a command with {arm} in it (replaced by on or off before each block)"
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
        any_order="each size is its own set of sessions, built and reported per size",
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
    think_time_s: float = spec(0.0, ge=0, doc="mean pause between turns, modeled seconds")
    think: Literal["fixed", "exponential", "lognormal"] = spec(
        "fixed", doc="distribution of the pause between turns (mean think_time_s)"
    )
    think_sigma: float = spec(0.5, gt=0, le=5, doc="shape of the lognormal think time")
    probe: Literal["none", "needle", "equivalence"] = spec("none", doc="correctness probe")
    shared_prefix_tokens: int = spec(
        0, ge=0, le=10_000_000, doc="tokens of a system prompt shared by all sessions (0: none)"
    )
    source: Literal["synthetic", "trace", "sharegpt"] = spec(
        "synthetic",
        doc="where requests come from: the synthetic sessions, [sessions.trace], "
        "or a conversation dataset ([sessions.sharegpt])",
    )
    trace: TraceSpec = field(default_factory=TraceSpec)
    sharegpt: ShareGPTSpec = field(default_factory=ShareGPTSpec)

    def __post_init__(self) -> None:
        check_source(self.source, self.trace)
        check_sharegpt_source(self.source, self.sharegpt)

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
        any_order="each policy is its own set of arms, run in the order given",
        doc="alternate | fixed | random | move-at:K (the client picks the replica); "
        "router:POLICY (a vllm-router started per block) | gateway (target.gateway) "
        "(a router picks it; see [target.router])",
    )


@dataclass(frozen=True)
class DesignSpec:
    """The experiment design: cache arms and the block order per placement."""

    cache: tuple[Literal["off", "on"], ...] = spec(
        ("off", "on"), any_order="the arms are named, not placed", doc="cache arms"
    )
    blocks: tuple[Literal["off", "on"], ...] = spec(
        ("off", "on", "on", "off"),
        repeats="a design repeats arms (OFF ON ON OFF) to see drift between blocks",
        any_order="the blocks run in the order given",
        doc="block order for each placement policy",
    )
    warmup_requests: int = spec(2, ge=0, doc="warm-up requests per replica before each block")
    warmup_tokens: int | None = spec(
        None,
        ge=64,
        le=1_000_000,
        doc="context tokens of each warm-up (default: two of the target's pool chunks, "
        "so the shared pool stores and serves something before any measured request)",
    )
    restart_between_blocks: bool = spec(
        True,
        doc="fresh replicas for each block when possible (false: the simulator keeps one "
        "process; managed replicas are kept for a next block of the same arm, their caches "
        "emptied and checked cold)",
    )

    def __post_init__(self) -> None:
        missing = sorted(set(self.blocks) - set(self.cache))
        if missing:
            raise ValueError(f"blocks: uses arm {missing[0]!r} not in design.cache")


@dataclass(frozen=True)
class LoadSpec:
    """How sessions arrive, and the load levels of a sweep.

    ``closed``: ``driver.concurrency`` sessions in flight, the next starting when one
    ends (today's default). Open loop: sessions start at a rate (sessions per modeled
    second) whatever the replicas' state: ``poisson`` (exponential gaps), ``constant``
    (equal gaps) or ``gamma`` (gaps of shape ``burstiness``: below 1 burstier than
    Poisson, above 1 more regular; vLLM's benchmark uses the same parameterisation).
    ``levels`` sweeps the load: concurrencies (closed) or rates (open), each level with
    its own blocks of every cache arm.
    """

    arrival: Literal["closed", "poisson", "constant", "gamma"] = spec("closed")
    levels: tuple[float, ...] = spec(
        (),
        gt=0,
        one_or_many=True,
        empty="one level: driver.concurrency (closed loop)",
        any_order="the levels run in the order given; the analysis orders them itself",
        doc="concurrencies (closed) or session start rates per modeled s (open); "
        "empty: one level (driver.concurrency, or the first rate)",
    )
    burstiness: float = spec(1.0, gt=0, le=100, doc="gamma shape of the gaps between starts")
    max_in_flight: int = spec(
        100_000, ge=1, le=1_000_000, doc="open loop: sessions in flight at most (a safety cap)"
    )

    def __post_init__(self) -> None:
        if self.arrival != "closed" and not self.levels:
            raise ValueError("levels: expected at least one rate for open-loop arrivals")
        if self.arrival == "closed" and any(v != int(v) for v in self.levels):
            raise ValueError("levels: expected whole concurrencies for closed-loop arrivals")


@dataclass(frozen=True)
class ObjectiveSpec:
    """The service objective goodput is measured against.

    A turn is *good* when its TTFT is at most ``ttft_s`` (modeled seconds on the
    simulated pair); a session is good when all its turns are. An arm *meets* the
    objective at a load level when at least ``attainment`` of its turns are good.
    """

    ttft_s: float | None = spec(None, gt=0, doc="TTFT objective, modeled seconds (none: off)")
    attainment: float = spec(0.9, gt=0, le=1, doc="share of good turns needed to meet it")


@dataclass(frozen=True)
class DriverSpec:
    """How the client drives the replicas."""

    concurrency: int = spec(4, ge=1, le=100_000, doc="sessions in flight at once")
    request_timeout_s: float = spec(900.0, gt=0, doc="stall limit per request, wall seconds")
    connect_timeout_s: float = spec(10.0, gt=0)


FaultKind = Literal["none", "stale", "noise"]
#: Faults a user can plant in the managed pair's KV connector (``target.managed.fault.kind``).
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)


@dataclass(frozen=True)
class ManagedFault:
    """A fault planted in the managed replicas' KV connector, for correctness canaries.

    ``stale``: the hit chunks keep what their KV blocks held before the load from the
    shared pool, as if the model read them before the copy finished (the transfer bug of
    the study behind sessiongen); ``noise``: seeded Gaussian noise as large as the hit
    chunks' own values is added to them after the load. Which chunks are hit is a seeded
    hash of each chunk's tokens, so a run is reproducible. Only cache-ON replicas load
    from the pool; a run with a fault is labelled as such (manifest, report, trend).
    """

    kind: FaultKind = spec(
        "none", doc='"stale" or "noise": plant that fault; "none": the healthy stack'
    )
    share: float = spec(
        1.0, gt=0, le=1, doc="share of the KV chunks loaded from the pool that the fault hits"
    )
    seed: int = spec(0, ge=0, doc="which chunks are hit (hashed with each chunk's tokens)")

    @property
    def planted(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class ManagedSpec:
    """Real vLLM replicas plus one LMCache server that sessiongen starts and stops."""

    device: Literal["cuda", "cpu"] = spec("cpu")
    model: str = spec("builtin:tiny", doc='HF id, local dir, or "builtin:tiny" (random weights)')
    vllm_args: tuple[str, ...] = spec(
        (),
        empty="none",
        repeats="a command line may repeat a value (--a 1 --b 1)",
        any_order="a command line, in the order given",
        doc="extra arguments for every vLLM replica",
    )
    replicas: int = spec(2, ge=1, le=64)
    gpus_per_replica: int = spec(1, ge=1)
    cpu_cores: tuple[int, ...] = spec(
        (),
        ge=0,
        empty="the cores sessiongen may run on",
        any_order="dealt out in the order given: the first share to replica 0",
        doc="device cpu: cores dealt out to the replicas' compute threads, an equal share "
        "each (empty: the cores sessiongen may run on); env VLLM_CPU_OMP_THREADS_BIND wins",
    )
    base_port: int = spec(0, ge=0, le=65000, doc="replica i on base_port+i (0: free ports)")
    lmcache_port: int = spec(0, ge=0, le=65535, doc="LMCache server port (0: a free port)")
    pool_size_gb: float = spec(3.0, gt=0, doc="LMCache L1 pool size, GB")
    chunk_size: int = spec(256, ge=1, doc="LMCache chunk size, tokens")
    eviction: str = spec("LRU", doc="LMCache eviction policy")
    max_model_len: int = spec(65536, ge=256)
    startup_timeout_s: float = spec(900.0, gt=0)
    env: dict[str, str] = spec(
        {}, check=_check_env, empty="none", doc="extra environment for every process"
    )
    fault: ManagedFault = field(default_factory=ManagedFault)


@dataclass(frozen=True)
class TargetSpec:
    """Where requests go: the embedded simulator, given endpoints, or managed replicas."""

    kind: Literal["sim", "endpoints", "managed"] = spec("sim")
    endpoints: tuple[str, ...] = spec(
        (),
        empty="none: kind sim or managed, or a gateway alone",
        any_order="replica i is the i-th URL, as replica_names are",
        doc="base URLs of existing OpenAI-compatible replicas",
    )
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
        empty="each replica is known by its index, or its URL",
        any_order="in endpoints order",
        doc="kind = endpoints: what each endpoint calls itself in replica_header or in "
        "system_fingerprint, in endpoints order (default: its index, or its URL)",
    )
    endpoints_off: tuple[str, ...] = spec(
        (),
        empty="none: one set of endpoints (target.endpoints)",
        any_order="replica i is the i-th URL",
        doc="kind = endpoints: replicas without the KV connector, the OFF arm's; with "
        "endpoints_on, the design's blocks alternate between the two pairs",
    )
    endpoints_on: tuple[str, ...] = spec(
        (),
        empty="none: one set of endpoints (target.endpoints)",
        any_order="replica i is the i-th URL",
        doc="kind = endpoints: replicas with the KV connector (shared cache), the ON arm's",
    )
    switch_command: str | None = spec(
        None,
        check=_check_switch_command,
        doc="kind = endpoints: a shell command run before every block, {arm} replaced by "
        "on or off, that puts target.endpoints in that arm; sessiongen waits until they "
        "are healthy and report the arm",
    )
    switch_timeout_s: float = spec(
        900.0, gt=0, doc="how long a switch may take: the command, then healthy replicas"
    )
    strict_arms: bool = spec(
        False,
        doc="replay exits 1 when an arm's counters contradict its label (an ON block whose "
        "cross-replica requests show no external hits, an OFF block that shows any)",
    )
    allow_arm_mismatch: bool = spec(
        False,
        doc="replay sends a block whose replicas say at start they are in the other arm "
        "(a KV connector in an OFF block, none in an ON block) instead of stopping",
    )
    sim: SimProfile = field(default_factory=SimProfile)
    managed: ManagedSpec = field(default_factory=ManagedSpec)
    router: RouterSpec = field(default_factory=RouterSpec)

    def __post_init__(self) -> None:
        self._check_arms()
        if self.kind == "endpoints" and not (self.endpoints or self.gateway or self.pairs):
            raise ValueError(
                "endpoints: expected at least one URL (or a gateway) when kind = endpoints"
            )
        urls = [("endpoints", url) for url in self.endpoints]
        urls += [("endpoints_off", url) for url in self.endpoints_off]
        urls += [("endpoints_on", url) for url in self.endpoints_on]
        urls += [("gateway", self.gateway)] if self.gateway is not None else []
        for key, url in urls:
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"{key}: expected http(s)://host:port, got {url!r}")
        if self.endpoints and self.replica_names and len(self.replica_names) != len(self.endpoints):
            raise ValueError("replica_names: expected one name per endpoint")
        if self.managed.fault.planted and self.kind != "managed":
            raise ValueError(
                "managed.fault.kind: a fault is planted only in managed replicas "
                f'(kind = "managed"), got kind = "{self.kind}"'
            )

    @property
    def pairs(self) -> bool:
        """Two sets of endpoints, one per cache arm (``endpoints_off``/``endpoints_on``)."""
        return bool(self.endpoints_off or self.endpoints_on)

    def _check_arms(self) -> None:
        """How the endpoints' arms are set: one pair per arm, a switch, or neither."""
        if self.pairs:
            if not (self.endpoints_off and self.endpoints_on):
                given, missing = (
                    ("endpoints_off", "endpoints_on")
                    if self.endpoints_off
                    else ("endpoints_on", "endpoints_off")
                )
                raise ValueError(f"{missing}: expected URLs too when {given} is given")
            if len(self.endpoints_off) != len(self.endpoints_on):
                raise ValueError(
                    f"endpoints_on: expected as many replicas as endpoints_off "
                    f"({len(self.endpoints_off)}), got {len(self.endpoints_on)}"
                )
            for key, clash in (
                ("endpoints", bool(self.endpoints)),
                ("switch_command", self.switch_command is not None),
                ("cache", self.cache is not None),
                ("gateway", self.gateway is not None),
            ):
                if clash:
                    raise ValueError(
                        f"{key}: not with endpoints_off/endpoints_on (each pair is one arm)"
                    )
            if self.replica_names and len(self.replica_names) != len(self.endpoints_on):
                raise ValueError("replica_names: expected one name per replica of a pair")
        if self.switch_command is not None and self.cache is not None:
            raise ValueError("cache: not with switch_command (it sets each block's arm)")


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
    load: LoadSpec = field(default_factory=LoadSpec)
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    target: TargetSpec = field(default_factory=TargetSpec)
    source: str = spec("<memory>", doc="file the scenario came from (set by the loader)")

    def to_dict(self) -> dict[str, object]:
        """The resolved scenario as plain data (for manifests and hashing)."""
        data: dict[str, object] = schema.to_plain(self)
        data.pop("source", None)
        return data

    def digest(self) -> str:
        """A short hash of what the measurements depend on: sessions, design, load.

        Not the target (the trend keeps targets apart by kind and version), the
        description or the objective (they do not change what is measured). Fields added
        after the first release count only when set away from their defaults, so a
        scenario that does not use them keeps its digest, and a nightly trend store its
        history (see :data:`LATER_FIELDS`).
        """
        data = self.to_dict()
        for key in ("target", "description", "objective"):
            data.pop(key, None)
        defaults = Scenario(name=self.name).to_dict()
        for path in LATER_FIELDS:
            section, _, name = path.partition(".")
            table, default = data[section], defaults[section]
            if isinstance(table, dict) and isinstance(default, dict) and name:
                if table.get(name) == default.get(name):
                    table.pop(name, None)
            elif not name and table == default:
                data.pop(section, None)
        return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


#: Scenario fields added after sessiongen 0.1.0: left out of the digest at their defaults.
LATER_FIELDS = (
    "design.warmup_tokens",
    "sessions.think",
    "sessions.think_sigma",
    "load",
    "sessions.source",
    "sessions.trace",
    "sessions.sharegpt",
)


def from_dict(
    raw: dict[str, object], source: str = "<memory>", overrides: Sequence[str] = ()
) -> Scenario:
    """Validate plain data (plus ``dotted.key=value`` overrides) into a :class:`Scenario`."""
    data = schema.apply_overrides(raw, list(overrides))
    if "source" in data:
        raise ScenarioError(source, "source", "unknown key (it is set by the loader)")
    data["source"] = source
    _merge_profile_file(data, source)
    built = schema.build(Scenario, data, source)
    # At load only, not in SessionsSpec.__post_init__: the builders derive specs with
    # dataclasses.replace (a dataset session's own turns), which must not be refused.
    try:
        check_applies(built.sessions)
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        raise ScenarioError(source, f"sessions.{key}", message) from None
    return built


#: ``target.sim.profile = "builtin:NAME"`` names a profile shipped in the package.
BUILTIN = "builtin:"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


def builtin_profiles() -> list[str]:
    """The names of the profiles shipped in the package (``builtin:NAME``)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def builtin_profile(name: str, source: str) -> Path:
    """The file of a shipped profile; a one-line error naming the known ones."""
    path = PROFILES_DIR / f"{name[len(BUILTIN) :]}.toml"
    if not path.is_file():
        known = ", ".join(BUILTIN + n for n in builtin_profiles())
        raise ScenarioError(source, "target.sim.profile", f"{name}: no such profile ({known})")
    return path


def _merge_profile_file(data: dict[str, object], source: str) -> None:
    """``target.sim.profile = "FILE.toml"``: the file's parameters, under explicit keys.

    A profile file (``sessiongen fit`` writes one) holds a ``[target.sim]`` table or flat
    parameter keys; a relative path is taken from the scenario file's folder, then from
    the working directory; ``builtin:NAME`` is a profile shipped in the package
    (:func:`builtin_profiles`). Keys set in the scenario or with ``--set`` win over the file.
    """
    target = data.get("target")
    sim = target.get("sim") if isinstance(target, dict) else None
    if not isinstance(sim, dict) or sim.get("profile") is None:
        return
    name = sim["profile"]
    if not isinstance(name, str) or not name:
        raise ScenarioError(source, "target.sim.profile", f"expected a file name, got {name!r}")
    path = Path(name)
    if name.startswith(BUILTIN):
        path = builtin_profile(name, source)
    elif not path.is_absolute() and not path.exists():
        beside = Path(source).parent / path
        path = beside if beside.exists() else path
    loaded = read_toml(path)
    nested = "target" in loaded
    params = loaded["target"].get("sim") if isinstance(loaded.get("target"), dict) else None
    params = params if nested else loaded
    if not isinstance(params, dict) or "profile" in params:
        raise ScenarioError(str(path), "target.sim", "expected a table of profile parameters")
    # Its own errors name the profile file, and the key as that file spells it.
    schema.build(SimProfile, params, str(path), prefix="target.sim" if nested else "")
    sim.update({k: v for k, v in params.items() if k not in sim}, profile=str(path))


def load(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read a scenario TOML file, apply overrides, validate; errors name file and key."""
    return from_dict(read_toml(path), source=str(path), overrides=overrides)
