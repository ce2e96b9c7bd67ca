"""Where the GPU runs' pool-on answers differ from pool-off ones: by how the prefix was served.

    .venv/bin/python bench/gpu/equivalence.py [--run-folder bench/gpu/2026-12-07]

For every run with both cache arms, each pool-on request is paired with the pool-off
request of the same prompt (placement, session, context, turn) and classed by how the
pool-on replica got its prefix: ``cold`` (nothing), ``local`` (its own prefix cache only),
``pool`` (the pool only) or ``local+pool`` (its own prefix cache up to a vLLM block, the
pool from there, so the pool's load starts inside an LMCache chunk). Local hits are the
counters' as :func:`sessiongen.records.counters.local_hits` mends them. Per class it
prints the pairs, how many answers differ (token ids, the output digest) and the
first-token logprob difference in units of bfloat16's resolution at the logprob's
magnitude (2**(floor(log2|lp|) - 7): 0.03125 for a logprob of -4 to -8), its median and
largest. Where a run holds both placements' pool-off arms it also prints how often those
differ on later turns: the same prompt prefilled in one piece (alternate) or after its own
prefix cache (fixed), no pool on either side, so what bfloat16 rounding alone does when a
prompt's prefill is split differently. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

from sessiongen.records.counters import local_hits

ROOT = Path(__file__).resolve().parent.parent.parent
PAIR = ["placement", "session_index", "context_tokens", "turn"]


def pairs(requests: Path) -> pl.DataFrame:
    df = pl.read_parquet(requests).filter(~pl.col("warmup"), pl.col("status") == "ok")
    off = df.filter(pl.col("cache") == "off").select(
        *PAIR, pl.col("output_digest").alias("digest_off"), pl.col("first_logprob").alias("lp_off")
    )
    on = df.filter(pl.col("cache") == "on").with_columns(
        pl.struct("local_hit_tokens", "external_hit_tokens", "cached_tokens")
        .map_elements(
            lambda r: local_hits(
                r["local_hit_tokens"], r["external_hit_tokens"], r["cached_tokens"]
            ),
            return_dtype=pl.Int64,
        )
        .alias("local")
    )
    local, pool = pl.col("local") > 0, pl.col("external_hit_tokens") > 0
    kind = (
        pl.when(local & pool)
        .then(pl.lit("local+pool"))
        .when(pool)
        .then(pl.lit("pool"))
        .when(local)
        .then(pl.lit("local"))
        .otherwise(pl.lit("cold"))
    )
    ulp = (2.0 ** (pl.col("lp_off").abs().log(2).floor() - 7)).alias("ulp")
    return (
        on.join(off, on=PAIR)
        .with_columns(kind.alias("prefix"), ulp)
        .with_columns(
            (pl.col("output_digest") != pl.col("digest_off")).alias("differs"),
            ((pl.col("first_logprob") - pl.col("lp_off")).abs() / pl.col("ulp")).alias("ulps"),
        )
    )


def split_null(requests: Path) -> pl.DataFrame | None:
    """Pool-off answers of one prompt under the two placements (no pool on either side):
    alternate placement recomputes every turn in one prefill, fixed placement prefills
    only the new tokens after its own prefix cache. Per turn > 1: pairs, and how many
    differ; None when the run lacks either placement's pool-off arm."""
    df = pl.read_parquet(requests).filter(
        ~pl.col("warmup"), pl.col("status") == "ok", pl.col("cache") == "off"
    )
    if not {"alternate", "fixed"} <= set(df["placement"].unique().to_list()):
        return None
    keys = ["session_index", "context_tokens", "turn"]
    sides = [
        df.filter(pl.col("placement") == p).select(*keys, pl.col("output_digest").alias(p))
        for p in ("alternate", "fixed")
    ]
    joined = sides[0].join(sides[1], on=keys).filter(pl.col("turn") > 1)
    return joined.select(
        pl.len().alias("pairs"), (pl.col("alternate") != pl.col("fixed")).sum().alias("differ")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-folder", type=Path, default=ROOT / "bench/gpu/2026-12-07")
    args = parser.parse_args()
    for run in sorted((args.run_folder / "runs").iterdir()):
        table = (
            pairs(run / "requests.parquet")
            .group_by("placement", "prefix")
            .agg(
                pl.len().alias("pairs"),
                pl.col("differs").sum().alias("answers_differ"),
                pl.col("ulps").median().alias("lp_ulps_median"),
                pl.col("ulps").max().alias("lp_ulps_max"),
            )
            .sort("placement", "prefix")
        )
        with pl.Config(tbl_rows=-1, tbl_width_chars=160, float_precision=2):
            print(run.name)
            print(table)
            null = split_null(run / "requests.parquet")
            if null is not None:
                print("pool off, alternate against fixed placement (turns after the first):")
                print(null)


if __name__ == "__main__":
    main()
