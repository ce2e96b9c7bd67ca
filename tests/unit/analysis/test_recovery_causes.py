"""Why a pool recovered less than the trace allows: partial chunks at
the end of the shared prefixes, and whole chunks it did not serve, on frames computed by
hand, and the report's sentence with the run's figures.

Chunks of 16 tokens; each row: infinite-cache tokens, local hits, pool hits:

    r1  40 shared, local 0,  pool 32  -> chunked 32, in reach 32, recovered 32, partial 8
    r2  40 shared, local 16, pool 0   -> in reach 16, recovered 0: missed 16, partial 8
    r3  10 shared, local 0,  pool 0   -> shorter than a chunk: partial 10
    r4  20 shared, local 20, pool 0   -> nothing beyond local
"""

from __future__ import annotations

import polars as pl

from sessiongen.analysis import reuse
from sessiongen.report.reusesection import eviction_text, recovery_lines

CHUNK = 16


def rows(cache: str = "on") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "placement": ["alternate"] * 4,
            "cache": [cache] * 4,
            "trace_shared_tokens": [40, 40, 10, 20],
            "local_hit_tokens": [0, 16, 0, 20],
            "external_hit_tokens": [32, 0, 0, 0],
        }
    )


def test_tokens_beyond_local_split_into_partial_missed_and_recovered() -> None:
    [r] = reuse.recovery_causes(rows(), CHUNK).to_dicts()
    assert r["beyond_local_tokens"] == 40 + 24 + 10
    assert (r["partial_chunk_tokens"], r["missed_tokens"], r["recovered_in_reach"]) == (26, 16, 32)
    assert r["partial_chunk_tokens"] + r["missed_tokens"] + r["recovered_in_reach"] == 74
    assert (r["beyond_requests"], r["short_requests"]) == (3, 1)
    assert reuse.recovery_causes(rows("off"), CHUNK).is_empty()  # the pool's arm only


def test_the_report_names_the_chunk_against_the_block_and_the_figures() -> None:
    evictions = eviction_text(footprint_tokens=640, pool_tokens=64_000.0)
    [line] = recovery_lines(rows(), CHUNK, 8, evictions)
    assert line.startswith("alternate: why the pool recovered 32 of the 74 tokens beyond")
    assert "whole chunks of 16 tokens (2.00 of the trace's 8-token blocks; LMCache's " in line
    assert "26 tokens (35%) lie in partial chunks" in line
    assert "1 of the 3 requests with reuse beyond the local hits share less than one" in line
    assert "16 tokens (22%) were in whole chunks the pool did not serve: not evictions" in line
    assert "is 1.0% of the pool" in line
    assert "is 200% of the pool" in eviction_text(footprint_tokens=200, pool_tokens=100.0)
    [unknown] = recovery_lines(rows(), None, 8, evictions)
    assert "chunk size is not known" in unknown and "default is 256" in unknown
