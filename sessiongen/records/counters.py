"""The counters a run's ``metrics.parquet`` holds, by the name in its ``metric`` column.

vLLM's names (cumulative tokens, or requests for the two gauges). The client reads them
from a replica's ``GET /metrics`` (:mod:`sessiongen.client.counters`); analysis reads
them back from the records, from here, never from the client.
"""

#: The replica's own (GPU) prefix cache: tokens queried, tokens served.
LOCAL_HITS = "vllm:prefix_cache_hits_total"
LOCAL_QUERIES = "vllm:prefix_cache_queries_total"
#: The KV connector (LMCache's shared pool): tokens queried, tokens served.
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
#: Requests running and waiting at the moment of the read.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"

#: vLLM's per-request phase histograms, as a sum of seconds and a count of requests
#: (a delta over a block gives the block's mean): queue (arrival to first scheduled),
#: prefill (first scheduled to first token) and decode (first token to last). The
#: decomposition of planned against measured latency (``bench/decomposition.py``) reads
#: them; a replica that does not export them simply lacks the rows.
QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
QUEUE_COUNT = "vllm:request_queue_time_seconds_count"
PREFILL_SUM = "vllm:request_prefill_time_seconds_sum"
PREFILL_COUNT = "vllm:request_prefill_time_seconds_count"
DECODE_SUM = "vllm:request_decode_time_seconds_sum"
DECODE_COUNT = "vllm:request_decode_time_seconds_count"
PHASES = {
    "queue": (QUEUE_SUM, QUEUE_COUNT),
    "prefill": (PREFILL_SUM, PREFILL_COUNT),
    "decode": (DECODE_SUM, DECODE_COUNT),
}

#: Counters kept in snapshots (others are ignored to keep metrics.parquet small).
TRACKED = (
    LOCAL_HITS,
    LOCAL_QUERIES,
    EXTERNAL_HITS,
    EXTERNAL_QUERIES,
    RUNNING,
    WAITING,
    *(name for pair in PHASES.values() for name in pair),
)


def local_hits(local: int | None, external: int | None, cached: int | None) -> int | None:
    """A request's local prefix-cache hit tokens from its counter delta ``local``, mended
    where the counter over-counted.

    vLLM 0.26 on CUDA with the LMCache connector counts a request's local prefix-cache
    lookup once per scheduling attempt while the connector's asynchronous lookup is
    pending, so the delta of :data:`LOCAL_HITS` ran to 4-5 times the prompt on an H100
    (524,288 local hit tokens for a 131,111-token prompt, whose usage said 131,072
    cached and whose connector counter said 0 external). The usage's ``cached_tokens``
    counts the local and the connector-loaded tokens once each; where the counters' sum
    exceeds it, the local share is ``cached - external``. Where it does not (every CPU
    run, every pool-off replica), the counter stands as measured.
    """
    if local is None or cached is None or local + (external or 0) <= cached:
        return local
    return max(0, cached - (external or 0))
