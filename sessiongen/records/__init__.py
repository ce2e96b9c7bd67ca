"""Run records: a run folder's files, how they are written and how they are read back.

- :mod:`.format`: the request and counter records, the manifest's shape;
- :mod:`.meta`: a manifest parsed once (:class:`~.meta.RunMeta`), old schemas included;
- :mod:`.io`: the request and metrics schemas, atomic writes, the manifest;
- :mod:`.counters`: the counter names of ``metrics.parquet``'s ``metric`` column;
- :mod:`.run`: a loaded run (:class:`~.run.Run`) in modeled seconds;
- :mod:`.merge`: runs of one design's different arms combined into one run folder.
"""
