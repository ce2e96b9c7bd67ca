"""The embedded simulated replicas: a vLLM-like server with a shared-cache model.

Its profile (every modeled parameter, calibrated from the study) is configuration and
lives in :mod:`sessiongen.scenario.simprofile`. One engine, two clocks: the scheduler
knows no clock; the served simulator drives it in wall time, the virtual driver in
virtual time.

- :mod:`.timing`: the engine's timing terms, one source for both engines (Python here,
  compiled into ``_core``, which includes its text);
- :mod:`.model`: the timing model, those terms as functions of a profile;
- :mod:`.cache`: chain-hash keys of token blocks (extendable) and the pool's LRU contents;
- :mod:`.kvcache`: one replica's KV cache in blocks (vLLM's block pool and prefix cache);
- :mod:`.pool`: the shared pool as the schedulers see it (switch, FIFO load link);
- :mod:`.scheduler`: vLLM V1's scheduler for one replica, a clock-agnostic state machine;
- :mod:`.cluster`: all replicas and the pool in modeled time, one event queue;
- :mod:`.virtual`: the engine on a virtual clock: scripted arrivals in, results out;
- :mod:`._core`: the same engine, compiled (Cython, built by
  ``pip install``; ``_core.pyx``), the chain hash's kernel, a trace prompt's
  token ids (``trace_tokens``) and its keys with each distinct trace block hashed once
  (``TraceKeys``), both for the planner's shape mode;
- :mod:`.compiled`: which engine runs (compiled where built, else Python; the same
  results);
- :mod:`.noise`: service-time noise, a lognormal factor on each request's prefill;
- :mod:`.prompt`: prompt token ids as the replicas see them (cl100k, a chat template);
- :mod:`.output`: deterministic outputs, needle answers, the planted corruption;
- :mod:`.engine`: the served simulator's engine: request preparation, wall-time driver;
- :mod:`.wire`: vLLM's OpenAI-compatible wire format;
- :mod:`.metrics`: Prometheus counters under vLLM's names;
- :mod:`.server`: one aiohttp app per replica (:func:`~.server.make_apps` for tests);
- :mod:`.process`: serving in this process, or in a child (:func:`~.process.launch_sim`,
  :func:`~.process.start_sim`), which exits when told to stop or when its parent dies;
- :mod:`.cli`: ``sessiongen sim serve`` / ``python -m sessiongen.sim``.
"""
