"""The run folder's formats, defined once: request records, counter records, the manifest.

A run folder ``runs/<run-id>/`` holds:

- ``requests.parquet``: one :class:`RequestRecord` per request; its columns and types
  are the dataclass's fields (:data:`REQUEST_SCHEMA` is derived from them);
- ``metrics.parquet``: one :class:`CounterRecord` per (block, replica, moment, counter);
- ``manifest.json``: a :class:`Manifest` (JSON only), read back through :class:`~.meta.RunMeta`,
  which parses it once, with the defaults older versions need.

Durations in ``requests.parquet`` are measured wall seconds. For simulated targets the
manifest's ``target.time_scale`` (wall seconds per modeled second) converts them to
modeled seconds: ``modeled = measured / time_scale``. Real targets have time scale 1.

Format history
--------------
- ``schema_version`` 1 (sessiongen 0.1.0): the columns below up to ``loop_lag_flag``;
  manifests with ``target.simulated`` (older ones only with ``target.kind == "sim"``)
  and the sim profile under ``target.profile`` (older: ``target.sim``).
- ``schema_version`` 2: adds ``prompt_digest`` (answers are compared only between
  requests with the same prompt), ``server_ttft_s`` (the simulator's own modeled TTFT,
  so the measurement error of a simulated run is known), the load columns
  ``load_level``, ``arrival_s``, ``think_s``, and ``hit_source``; counter records get
  ``t_s`` and the moment ``during`` (a scrape every second while a block runs). Readers
  fill the columns a version lacks with nulls.
- ``schema_version`` 3: routed placements (``router:POLICY``, ``gateway``). ``replica``
  and ``cross_replica`` may be null (a router picked the replica and nothing said which);
  ``replica_source`` says how the serving replica was found (:data:`REPLICA_SOURCES`).
  Blocks may carry a ``router`` entry (the router process that served them).
- ``schema_version`` 4: ``server_queue_s``, the server's own account of a request's wait
  between arrival and admission (the simulator's); runs of the planner (target kind
  ``plan``: virtual clock, every duration modeled) with ``replica_source`` and
  ``hit_source`` ``planner``. Later in version 4 (optional keys, so no new version): a
  fault planted in managed replicas (``target.managed.fault``) is described in
  ``target.fault`` (kind, share, seed, label), and each block it ran in carries
  ``fault``, what it hit (loads, loads_hit, chunks, chunks_hit).
- Endpoints that say they are simulated (``/version``): ``target.simulated`` true,
  ``target.time_scale`` theirs, ``target.time_scale_known`` false (and time scale 1)
  when they did not say it; absent, the time scale is known (every older manifest).
- Later in version 4 (readers need nothing new): target kinds ``endpoint-pairs``
  (one pair per arm) and ``switched`` (one pair, its arm set by the user's command before
  every block); blocks may carry ``kv_connector`` (what each replica said of its KV
  connector) and ``switch``; a run merged from single-arm runs (``sessiongen merge``)
  has ``merged_from`` and, per block, ``source_run`` and ``source_block``.
- Later in version 4 (optional columns: older runs lack them and readers fill nulls):
  trace replays (``sessions.source = "trace"``) record each request's ``trace_line``
  and what the trace says it shares with earlier requests, ``trace_shared_blocks``,
  ``trace_shared_tokens`` and ``trace_reuse_distance`` (null for synthetic sessions and
  warm-ups); their ``context_tokens`` is 0 (a trace has no context sizes).
- Later in version 4 (optional column): ``arrival_late_s``, how long after its stated
  modeled arrival the simulator took a request (replays on the modeled clock; null where
  the target states no modeled arrivals, and in older runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import polars as pl

SCHEMA_VERSION = 4

#: How a record's serving replica was found (``replica_source``). ``placement``: the
#: client sent the request to that replica itself. For routed requests, ``header`` (a
#: response header names it), ``fingerprint`` (the response's ``system_fingerprint``
#: names it), ``counters`` (at concurrency 1, only that replica's ``/metrics`` counters
#: moved), joined with ``+`` when several methods agreed; ``unknown`` when none could
#: tell, ``conflict`` when two disagreed. The replica is never guessed: null for both.
#: ``planner``: the planner's model of the router picked it (virtual runs).
REPLICA_SOURCES = (
    "placement",
    "header",
    "fingerprint",
    "counters",
    "unknown",
    "conflict",
    "planner",
)

#: Columns that identify an arm, and a cell of the per-turn tables.
ARM_KEYS = ("placement", "cache")
CELL_KEYS = ("placement", "cache", "context_tokens", "turn")


def column(dtype: pl.DataType, doc: str, default: Any = None) -> Any:
    """A record field: its Parquet type and what it means (nullable, default None)."""
    return field(default=default, metadata={"dtype": dtype, "doc": doc})


def key(dtype: pl.DataType, doc: str) -> Any:
    """A record field that every record must give (no default)."""
    return field(metadata={"dtype": dtype, "doc": doc})


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """One request of a run: where it went, what it asked, what was measured."""

    run_id: str = key(pl.String(), "the run")
    block: int = key(pl.Int32(), "block index in execution order, 0-based, across placements")
    block_in_placement: int = key(pl.Int32(), "0..len(design.blocks)-1 within its placement")
    placement: str = key(
        pl.String(), "alternate | fixed | random | move-at:K | router:POLICY | gateway"
    )
    cache: str = key(pl.String(), "off | on")
    session_id: str | None = column(pl.String(), "the session (None for warm-ups)")
    session_index: int | None = column(pl.Int32(), "the session's index in the scenario")
    context_tokens: int = key(pl.Int64(), "the session's initial context size (a grouping key)")
    turn: int = key(pl.Int32(), "1-based")
    replica: int | None = column(pl.Int32(), "the replica that served it (null: unknown)")
    cross_replica: bool | None = column(
        pl.Boolean(), "the session's previous turn ran on another replica (null: unknown)"
    )
    warmup: bool = key(pl.Boolean(), "warm-up request: excluded from results")
    prompt_tokens: int | None = column(pl.Int64(), "server usage")
    content_tokens: int | None = column(pl.Int64(), "client count of message-content tokens")
    cached_tokens: int | None = column(pl.Int64(), "usage.prompt_tokens_details.cached_tokens")
    completion_tokens: int | None = column(pl.Int64(), "server usage")
    output_chunks: int | None = column(pl.Int64(), "content deltas received")
    queue_s: float | None = column(pl.Float64(), "waited for a concurrency slot before send")
    ttfb_s: float | None = column(pl.Float64(), "send -> first response byte")
    ttft_s: float | None = column(pl.Float64(), "send -> first non-empty content delta")
    e2e_s: float | None = column(pl.Float64(), "send -> end of stream")
    itl_p50_s: float | None = column(pl.Float64(), "median gap between content deltas")
    itl_max_s: float | None = column(pl.Float64(), "largest gap between content deltas")
    send_s: float | None = column(pl.Float64(), "send time, seconds since run start")
    status: str = key(pl.String(), "ok | http_error | connect_error | stream_error | timeout | ...")
    http_status: int | None = column(pl.Int32(), "HTTP status of the response")
    error: str | None = column(pl.String(), "what went wrong, one line")
    local_hit_tokens: int | None = column(pl.Int64(), "/metrics delta, null where not exact")
    external_hit_tokens: int | None = column(pl.Int64(), "/metrics delta, null where not exact")
    expected: str | None = column(pl.String(), "needle answer, or null")
    answer_correct: bool | None = column(pl.Boolean(), "needle graded, or null")
    output_digest: str | None = column(pl.String(), "digest of output token ids (or text)")
    output_text: str | None = column(pl.String(), "the answer (first 200 characters)")
    first_logprob: float | None = column(pl.Float64(), "logprob of the first output token")
    loop_lag_flag: bool | None = column(
        pl.Boolean(),
        "the client's event loop stalled (woke more than 1 ms late) for more than 2% of this "
        "request's TTFT while it waited for its first token (v1: any stall over 5 ms)",
    )
    # schema_version 2:
    prompt_digest: str | None = column(pl.String(), "digest of the exact messages sent")
    server_ttft_s: float | None = column(
        pl.Float64(), "the server's own TTFT for the request (simulator: modeled x time scale)"
    )
    load_level: float | None = column(
        pl.Float64(), "the block's load level: concurrency (closed) or start rate (open)"
    )
    arrival_s: float | None = column(
        pl.Float64(), "the session's scheduled start, seconds from the block's start"
    )
    think_s: float | None = column(pl.Float64(), "the pause before this turn")
    hit_source: str | None = column(
        pl.String(),
        "where local/external hit tokens come from: counters (exact, no overlap) | "
        "server (its per-request account) | null (unknown: cached_tokens only)",
    )
    # schema_version 3:
    replica_source: str | None = column(
        pl.String(), "how the serving replica was found (REPLICA_SOURCES; v1-2: placement)"
    )
    server_queue_s: float | None = column(
        pl.Float64(), "the server's own arrival -> admission wait (simulator, planner; v1-3: null)"
    )
    # later in schema_version 4 (trace replays; null otherwise and in older runs):
    trace_line: int | None = column(pl.Int64(), "trace replays: the request's line in the trace")
    trace_shared_blocks: int | None = column(
        pl.Int32(), "trace replays: leading hash-id blocks seen in earlier requests of the trace"
    )
    trace_shared_tokens: int | None = column(
        pl.Int64(), "trace replays: those blocks' prompt tokens (an infinite cache's hit)"
    )
    trace_reuse_distance: int | None = column(
        pl.Int64(),
        "trace replays: largest LRU stack distance, in blocks, of those blocks (null: none shared)",
    )
    # later in schema_version 4 (replays on the simulator's modeled clock):
    arrival_late_s: float | None = column(
        pl.Float64(),
        "the server took the request this long after its stated modeled arrival (simulator: "
        "modeled x time scale; 0: on time; null: no modeled arrival stated)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterRecord:
    """One counter of one replica read at one moment of a block (``metrics.parquet``)."""

    run_id: str = key(pl.String(), "the run")
    block: int = key(pl.Int32(), "block index")
    placement: str = key(pl.String(), "the block's placement")
    cache: str = key(pl.String(), "the block's cache arm")
    replica: int = key(pl.Int32(), "replica index")
    moment: str = key(pl.String(), "before | after")
    metric: str = key(pl.String(), "Prometheus counter name")
    value: float = key(pl.Float64(), "its value (summed over labels)")
    t_s: float | None = column(pl.Float64(), "when it was read, seconds since the run's start")


def schema_of(cls: type[Any]) -> dict[str, pl.DataType]:
    """The Parquet schema of a record class: its fields, in order, with their types."""
    return {f.name: f.metadata["dtype"] for f in dataclasses.fields(cls)}


#: The ``requests.parquet`` schema.
REQUEST_SCHEMA = schema_of(RequestRecord)
#: The ``metrics.parquet`` schema.
METRICS_SCHEMA = schema_of(CounterRecord)


def frame_of_records(records: Sequence[Any], cls: type[Any]) -> pl.DataFrame:
    """Records of ``cls`` as a frame with exactly its schema (empty-safe)."""
    schema = schema_of(cls)
    cols = {name: [getattr(r, name) for r in records] for name in schema}
    return pl.DataFrame(cols, schema=schema)


# --- the manifest (JSON) ------------------------------------------------------------------


class ToolIdentity(TypedDict):
    """sessiongen's version and git SHA."""

    sessiongen_version: str
    git_sha: str | None


class BlockOrder(TypedDict):
    """One planned block."""

    placement: str
    cache: str


class KvConnector(TypedDict, total=False):
    """What a replica says of its KV connector (every key optional)."""

    configured: bool  # a connector is (True) or is not (False) configured, where told
    connector: str  # its name (kv_transfer_config.kv_connector)
    role: str  # kv_role
    source: str  # where ``configured`` comes from: server_info | sessiongen_sim_info
    metrics: list[str]  # connector-related metric families /metrics lists


class EngineFacts(TypedDict, total=False):
    """One replica's engine, as far as it told (every key optional;
    :mod:`sessiongen.client.engine` reads it)."""

    block_size: int  # tokens per KV block
    kv_cache_tokens: int  # KV cache capacity, tokens
    num_blocks: int  # KV blocks
    max_model_len: int
    max_num_batched_tokens: int  # token budget of one engine step
    max_num_seqs: int  # most requests running at once
    sources: list[str]  # which endpoints answered
    kv_connector: KvConnector  # what it says of its KV connector


class ServerFacts(TypedDict, total=False):
    """One URL of the target as its preflight found it (the target's ``servers``)."""

    url: str
    models: Any  # its GET /v1/models, JSON as it answered
    version: Any  # its GET /version, JSON as it answered (None: no answer)
    engine: EngineFacts  # replicas only, not a gateway
    gateway: bool
    arm: str  # two pairs: the cache arm of the pair it belongs to


class RouterInfo(TypedDict):
    """The target's ``router``: the routers a run may start in front of the replicas."""

    spec: Any  # [target.router] as resolved (plain JSON)
    gateway: str | None  # the user's own router (target.gateway), if any
    vllm_router_version: str | None
    routers_started: int


class ProbeRow(TypedDict):
    """One cold-probe request of a cache reset: what it found cached."""

    prompt_tokens: int | None
    cached_tokens: int | None
    local_hits: float | None
    external_hits: float | None


class ResetFacts(TypedDict, total=False):
    """A block's ``reset``: the caches emptied instead of a restart, and the cold probe
    that proves it (``verified``), else why not and the restart that followed."""

    verified: bool
    method: str
    reason: str
    seeded: list[ProbeRow]  # the requests sent before the reset, each replica's prompt
    probe: list[ProbeRow]  # the same prompts after it: cold on every replica, or not
    seconds: float
    fallback: str  # "restart" where the reset was not verified


class SwitchFacts(TypedDict, total=False):
    """A block's ``switch``: the user's command that set its arm, and what followed."""

    block: int
    arm: str
    command: str
    log: str
    exit_status: int
    command_s: float  # seconds the command took
    ready_s: float  # seconds until every replica was healthy and in the arm
    engine: list[EngineFacts]
    reported_arm: str | None  # the arm the replicas then reported, where one


class HostFacts(TypedDict):
    """The client host, kept beside the measurements (the manifest's ``host``)."""

    hostname: str
    platform: str
    python: str
    cpu_count: int | None
    machine: str
    gpus: NotRequired[list[str]]  # "name, memory, driver" per GPU, where nvidia-smi answers


class TargetInfo(TypedDict, total=False):
    """The manifest's ``target``: what replay talked to (every kind's keys; a kind says
    those it knows). Readers parse it once, old manifests included: :class:`~.meta.RunMeta`."""

    kind: str  # sim | endpoints | two pairs | switched | managed | plan
    simulated: bool
    note: str  # the line the report opens with ("SIMULATED: ...")
    time_scale: float  # modeled seconds per measured second (1 for real replicas)
    time_scale_known: bool
    time_scale_from: str  # where it came from: "/version"
    replicas: int
    profile: Any  # the simulator's profile as resolved (plain JSON)
    cache: str | None  # the arm the given endpoints are in (one arm per run)
    endpoints: list[str]
    endpoints_off: list[str]
    endpoints_on: list[str]
    servers: list[ServerFacts]
    switch_command: str
    switch_timeout_s: float
    blocks: list[Any]  # per block, what the target did (managed pairs, switches)
    spec: Any  # [target.managed] as resolved (plain JSON)
    fault: Any  # a planted fault (managed): what and where
    router: RouterInfo
    served_by: Any  # how the replica that served a routed turn is found (plain JSON)
    merged_from: list[Any]  # merged runs: each run's id, arms and whole target
    prompts: str  # plan runs: prompts tokenized exactly, or keys of the same shape
    engine: str  # plan runs: the engine that planned it (compiled | python)


class BlockEntry(TypedDict):
    """What happened to one block (the manifest's ``blocks``); targets add their facts."""

    block: int
    placement: str
    cache: str
    block_in_placement: int
    salt: str
    status: str  # ok | failed | interrupted
    started_at: str
    ended_at: NotRequired[str]
    errors: NotRequired[int]
    error: NotRequired[str]
    workers: NotRequired[list[dict[str, float]]]  # each worker's loop lag (LagMonitor)
    # What the target says of the block (BlockFacts):
    restarted: NotRequired[bool]
    pid: NotRequired[int | None]
    stop: NotRequired[dict[str, str]]
    dead_replicas: NotRequired[list[int]]
    lmcache_alive: NotRequired[bool]
    router: NotRequired[dict[str, object]]
    modeled_s: NotRequired[float]  # plan runs: the block's length on the virtual clock
    startup_s: NotRequired[float | None]
    reset: NotRequired[ResetFacts]
    kept: NotRequired[bool]
    kv_connector: NotRequired[list[KvConnector]]
    switch: NotRequired[SwitchFacts]
    source_run: NotRequired[str]  # merged runs: the run the block came from
    source_block: NotRequired[int]  # ... and its index there
    fault: NotRequired[dict[str, int]]


class BlockFacts(TypedDict, total=False):
    """What a target says of a block it closed (merged into the block's entry)."""

    restarted: bool
    pid: int | None
    stop: dict[str, str]
    dead_replicas: list[int]
    lmcache_alive: bool
    status: str
    router: dict[str, object]  # the router started for the block: policy, process, outcome
    startup_s: float | None  # seconds its freshly started replicas took to become ready
    reset: ResetFacts  # caches emptied instead of a restart: how, and the cold probe
    kept: bool  # its replicas were left running for the next block (of the same arm)
    # What each replica said of its KV connector when the block opened (client.engine's
    # KvConnector, in URL order; empty where it said nothing).
    kv_connector: list[KvConnector]
    switch: SwitchFacts  # the user's switch command that set the block's arm, and after
    fault: dict[str, int]  # what a planted fault hit in the block (managed: FaultTally)


def merge_facts(entry: BlockEntry, facts: BlockFacts) -> None:
    """Record what the target says of a block in the block's manifest entry."""
    if "restarted" in facts:
        entry["restarted"] = facts["restarted"]
    if "pid" in facts:
        entry["pid"] = facts["pid"]
    if "stop" in facts:
        entry["stop"] = facts["stop"]
    if "dead_replicas" in facts:
        entry["dead_replicas"] = facts["dead_replicas"]
    if "lmcache_alive" in facts:
        entry["lmcache_alive"] = facts["lmcache_alive"]
    if "status" in facts:
        entry["status"] = facts["status"]
    if "router" in facts:
        entry["router"] = facts["router"]
    if "startup_s" in facts:
        entry["startup_s"] = facts["startup_s"]
    if "reset" in facts:
        entry["reset"] = facts["reset"]
    if "kept" in facts:
        entry["kept"] = facts["kept"]
    if "kv_connector" in facts:
        entry["kv_connector"] = facts["kv_connector"]
    if "switch" in facts:
        entry["switch"] = facts["switch"]
    if "fault" in facts:
        entry["fault"] = facts["fault"]


class MergedRun(TypedDict):
    """One run that ``sessiongen merge`` combined (the manifest's ``merged_from``)."""

    run_id: str
    path: str
    arms: list[str]  # the cache arms its blocks ran


class Manifest(TypedDict):
    """``manifest.json`` as written (see the module's format history)."""

    schema_version: int
    run_id: str
    scenario_name: str
    scenario_source: str
    scenario: dict[str, object]  # Scenario.to_dict: the scenario as resolved
    scenario_digest: str
    seed: int
    salt: str
    tokenizer: str
    text_generator: str
    tool: ToolIdentity
    host: HostFacts
    target: TargetInfo
    block_order: list[BlockOrder]
    blocks: list[BlockEntry]
    started_at: str
    ended_at: str | None
    complete: bool
    loop_lag: NotRequired[dict[str, float]]  # LagMonitor.summary
    calibration: NotRequired[dict[str, float | str | None]]  # calibrate's figures
    merged_from: NotRequired[list[MergedRun]]  # sessiongen merge: the runs combined
