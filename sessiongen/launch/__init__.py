"""Real servers that sessiongen starts and stops itself: vLLM plus one LMCache server, and
vllm-router in front of replicas.

- :mod:`.tinymodel`: the ``builtin:tiny`` model (cl100k tokenizer, seeded random weights);
- :mod:`.commands`: the exact command lines and environments, and the stack's versions;
- :mod:`.faults`: a fault planted in the replicas' KV connector (``target.managed.fault``):
  its connector config, the seeded chunks it hits, its log;
- :mod:`.faultconnector`: that fault's wrapper of LMCache's connector, which vLLM loads;
- :mod:`.net`: free ports and health checks;
- :mod:`.procs`: process groups, stopping without orphans, the records of what ran;
- :mod:`.pair`: :class:`~.pair.ManagedPair`, one pair from start to stop;
- :mod:`.router`: :class:`~.router.ManagedRouter`, vllm-router in front of replicas;
- :mod:`.state`: ``pair up / down / status`` through a state file.

Nothing here imports vLLM, LMCache or vllm-router: they run as separate processes, so
the package imports (and type-checks) without them installed. The one exception,
:mod:`.faultconnector`, is imported by vLLM inside its own process, never by sessiongen.
"""
