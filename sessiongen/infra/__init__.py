"""Infrastructure every stage uses, written once.

- :mod:`.files`: atomic writes (temp file + rename) with the mode the umask implies, and
  one-line errors for paths that cannot be written;
- :mod:`.tomlfile`: TOML files read with one-line errors naming the file;
- :mod:`.procs`: process groups: start in a new session, liveness from ``/proc``, stop
  with SIGTERM then SIGKILL, no orphans;
- :mod:`.signals`: SIGTERM and SIGHUP stop as Ctrl-C does; a second signal hurries the
  clean-up, never cuts it short; ``asyncio.run`` whose signals cancel at an ``await``;
- :mod:`.net`: free ports below the ephemeral range, health checks and waiting on them;
- :mod:`.progress`: a block's console progress: a bar on a terminal, bounded plain lines
  elsewhere (replay's and the planner's);
- :mod:`.stages`: wall and CPU time per named stage of a command (``plan --verbose``);
- :mod:`.lazy`: third-party modules imported on their first use (scipy's statistics);
- :mod:`.collector`: when the cyclic garbage collector runs (not over the imports'
  objects during a plan, not at all during a block);
- :mod:`.extensions`: the optional compiled modules, used only when as new as their
  source, and the one ``SESSIONGEN_ENGINE`` rule that chooses them or their Python twins.

Nothing here imports any other part of sessiongen but :mod:`sessiongen.errors`.
"""
