"""The client: one measured request at a time, timestamped next to the socket.

- :mod:`.http1`: the lean HTTP/1.1 exchange and its keep-alive connection pool;
- :mod:`.driver`: a streamed request measured (TTFT, ITL, usage), faults as statuses;
- :mod:`.lagmon`: the event-loop lag monitor that flags requests a stall reached into;
- :mod:`.counters`: the replicas' Prometheus counters (``/metrics``);
- :mod:`.engine`: what a replica tells of its engine (KV block and cache, scheduler limits).
"""
