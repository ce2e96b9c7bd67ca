"""Prometheus metrics of one simulated replica, under vLLM's names.

Token counters are cumulative since start, like vLLM's: ``prefix_cache_*`` for the
replica's own prefix cache, ``external_prefix_cache_*`` for the shared pool (the
connector); external queries move only while the pool is on, as vLLM without a
connector reports none. They count each request once, at its first admission (a request
preempted and readmitted is not counted again; ``vllm:num_preemptions_total`` counts
preemptions). ``vllm:num_requests_running`` / ``_waiting`` are the scheduler's running
batch and waiting queue, ``vllm:kv_cache_usage_perc`` the share of KV blocks held by
running requests (cached blocks nobody holds count as free, as in vLLM).
``vllm:time_to_first_token_seconds`` observes *modeled* seconds. ``sessiongen_sim_info``
says this is a simulator and carries its time scale.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sessiongen._version import __version__

# vLLM's buckets for time to first token (seconds).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


class ReplicaMetrics:
    """One replica's registry and the few operations the server performs on it."""

    def __init__(self, model_name: str, replica: int) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.replica = replica
        reg, labels = self.registry, ["model_name"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg).labels(model_name=model_name)

        self.queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens")
        self.hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens")
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries", "External (shared pool) queries, in tokens"
        )
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits", "External (shared pool) hits, in tokens"
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens")
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, MODELED seconds (wall = modeled * time_scale)",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(model_name=model_name)
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted (recompute)")
        self._running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch", labels, registry=reg
        )
        self._waiting = Gauge(
            "vllm:num_requests_waiting", "Requests in the waiting queue", labels, registry=reg
        )
        self._kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: share of blocks held by running requests (1 = 100 percent)",
            labels,
            registry=reg,
        )
        self._info = Gauge(
            "sessiongen_sim_info",
            "This replica is sessiongen's simulator; time_scale = wall s per modeled s",
            ["model_name", "replica", "version", "time_scale", "shared_cache"],
            registry=reg,
        )

    def watch(
        self,
        running: Callable[[], int],
        waiting: Callable[[], int],
        kv_usage: Callable[[], float],
    ) -> None:
        """Read the scheduler's gauges at scrape time."""
        self._running.labels(model_name=self.model_name).set_function(running)
        self._waiting.labels(model_name=self.model_name).set_function(waiting)
        self._kv_usage.labels(model_name=self.model_name).set_function(kv_usage)

    def set_info(self, time_scale: float, shared_cache: bool) -> None:
        """(Re)label the info gauge after a configuration change."""
        self._info.clear()
        self._info.labels(
            model_name=self.model_name,
            replica=str(self.replica),
            version=__version__,
            time_scale=repr(time_scale),
            shared_cache="on" if shared_cache else "off",
        ).set(1)

    def record(self, prompt_tokens: int, local_hit: int, pool_hit: int, pool_on: bool) -> None:
        """Count one request's prefix-cache lookups (tokens)."""
        self.queries.inc(prompt_tokens)
        self.hits.inc(local_hit)
        self.prompt_tokens.inc(prompt_tokens)
        if pool_on:
            self.external_queries.inc(prompt_tokens)
            self.external_hits.inc(pool_hit)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        data: bytes = generate_latest(self.registry)
        return data
