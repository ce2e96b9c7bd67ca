"""The workload: token-exact, deterministic multi-turn sessions built from a scenario,
Mooncake-style traces read and written, and conversation datasets read. Its tokenizers and
the needle probes' phrasing are in :mod:`sessiongen.text`, which the simulator reads prompts
with too.

- :mod:`.textgen`: prose of an exact token length;
- :mod:`.sessions`: a scenario's sessions for one salt, from one source, and warm-ups;
- :mod:`.source`: the protocol every source of sessions follows, picked by name;
- :mod:`.synthetic`, :mod:`.tracesource`, :mod:`.chatsource`: the three sources (written
  from the scenario, a trace's, a conversation dataset's);
- :mod:`.requests`: a turn's request (exact body, texts kept once, the salt's marker);
- :mod:`.generate`: every request as JSON lines (``sessiongen generate``);
- :mod:`.trace`: Mooncake-style JSONL traces streamed and validated line by line;
- :mod:`.tracestats`: what a trace implies: size, span, infinite-cache reuse (``trace-info``);
- :mod:`.reuse`: each trace request's shared blocks and reuse distance (LRU stack distance),
  its walk compiled in :mod:`._reuse` (``_reuse.pyx``) where built, the same facts;
- :mod:`.traceprompts`: token-exact prompts whose shared blocks are the trace's hash ids;
- :mod:`.tracesessions`: a trace as the replay's sessions (turns, start times, delays, facts);
- :mod:`.sharegpt`: ShareGPT-shaped conversation datasets (JSON or JSONL) read and checked;
- :mod:`.sharegptsessions`: a dataset as sessions (kept turns, exact counts, first-turn padding);
- :mod:`.export`: a scenario's requests as a Mooncake-style trace (``sessiongen export``).
"""
