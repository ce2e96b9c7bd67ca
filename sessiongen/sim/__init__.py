"""The embedded simulated replicas: a vLLM-like server with a shared-cache model.

Its profile (every modeled parameter, calibrated from the study) is configuration and
lives in :mod:`sessiongen.scenario.simprofile`.

- :mod:`.model`: the timing model, pure functions from a profile to modeled seconds;
- :mod:`.cache`: the per-replica prefix cache and the shared pool (chain-hashed blocks);
- :mod:`.prompt`: prompt token ids as the replicas see them (cl100k, a chat template);
- :mod:`.output`: deterministic outputs, needle answers, the planted corruption;
- :mod:`.engine`: the replicas' state and their prefill schedule;
- :mod:`.wire`: vLLM's OpenAI-compatible wire format;
- :mod:`.metrics`: Prometheus counters under vLLM's names;
- :mod:`.server`: one aiohttp app per replica (:func:`~.server.make_apps` for tests);
- :mod:`.process`: serving in this process, or in a child (:func:`~.process.start_sim`);
- :mod:`.cli`: ``sessiongen sim serve`` / ``python -m sessiongen.sim``.
"""
