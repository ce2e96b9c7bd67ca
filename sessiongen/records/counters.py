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

#: Counters kept in snapshots (others are ignored to keep metrics.parquet small).
TRACKED = (LOCAL_HITS, LOCAL_QUERIES, EXTERNAL_HITS, EXTERNAL_QUERIES, RUNNING, WAITING)
