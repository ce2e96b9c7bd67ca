"""A run's correctness verdicts: what the report shows first, the trend counts, replay exits on.

:func:`correctness` judges a run once (:mod:`sessiongen.analysis.correctness` has the
definitions) and sums it up per probe: :class:`Needles` for needle probes,
:class:`Equivalence` for the equivalence probe (divergence rate, largest first-token
logprob difference from OFF, the worst case). :func:`correctness_cells` gives the same
counts per arm and turn for ``summary`` rows and the trend store, so that the report, the
trend and ``replay``'s exit status count one and the same thing: cache failures.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from sessiongen.analysis import hypotheses
from sessiongen.analysis.correctness import (
    AGREES,
    ALPHA,
    DIVERGED,
    LOGPROB_TOL,
    NO_OFF,
    NOT_EXERCISED,
    judge_needles,
    judge_outputs,
    needle_off_misses,
    off_self_disagreements,
    output_prompts,
    verdict,
)
from sessiongen.analysis.prompts import BASIS_DIGEST, KeyedRequests, keyed_requests
from sessiongen.records.format import CELL_KEYS
from sessiongen.records.run import Run

GROUP_KEYS = ("placement", "context_tokens", "session_id", "turn")
WORST_ROW_COLUMNS = (
    "block",
    "cache",
    "replica",
    "cached_tokens",
    "external_hit_tokens",
    "output_digest",
    "first_logprob",
)


@dataclass(frozen=True)
class NoiseBaseline:
    """Pool-served divergences against what the model does with no pool involved.

    ``pool_compared`` / ``pool_diverged``: ON requests served from the shared pool and
    compared with a consistent OFF answer, and those that differed; ``base_compared`` /
    ``base_diverged``: the baseline's comparisons (ON requests the pool did not serve,
    and the OFF arm's answers to a prompt against each other) and disagreements.
    ``p_value``: the one-sided exact test that the pool-served rate is higher
    (:func:`sessiongen.analysis.hypotheses.rate_exceeds`), ``alpha`` its level.
    """

    pool_compared: int
    pool_diverged: int
    base_compared: int
    base_diverged: int
    p_value: float
    alpha: float = ALPHA

    @classmethod
    def of(
        cls, pool: tuple[int, int], base: tuple[int, int], alpha: float = ALPHA
    ) -> NoiseBaseline:
        """From (compared, diverged) of the pool-served requests and of the baseline."""
        p = hypotheses.rate_exceeds(pool[1], pool[0], base[1], base[0])
        return cls(pool[0], pool[1], base[0], base[1], p, alpha)

    @property
    def significant(self) -> bool:
        """The pool-served divergence rate is surely above the baseline's."""
        return self.pool_diverged > 0 and self.p_value < self.alpha

    def text(self) -> str:
        """``3 of 50 pool-served vs 0 of 130 without the pool (exact test p = 0.014)``."""
        return (
            f"{self.pool_diverged} of {self.pool_compared} pool-served answers differ from "
            f"OFF, against {self.base_diverged} of {self.base_compared} where the pool had "
            f"no part (cold and local ON turns, OFF against itself; one-sided exact test "
            f"p = {self.p_value:.3g}, level {self.alpha:g})"
        )


@dataclass(frozen=True)
class WorstCase:
    """The worst compared ON request: where it ran and how its answer differs from OFF's."""

    placement: str
    context_tokens: int
    session_id: str
    turn: int
    block: int
    output_digest: str | None
    off_digests: str | None  # OFF's answers to the prompt: their digests, comma-joined
    ids_differ: bool
    logprob_diff: float | None  # first-token logprob, from OFF's mean


@dataclass(frozen=True)
class Equivalence:
    """The equivalence probe of a run, counted against the OFF arm.

    ``compared``: ON requests judged against a consistent OFF answer to the same prompt;
    ``exercised``: those of them served from the shared pool (``evidence`` says how that
    is known: ``request``, ``block`` or ``none``). ``ids_differ`` and
    ``logprob_beyond_tol`` count compared ON requests whose token ids differ from OFF's,
    or whose first-token logprob is further than ``logprob_tol`` from OFF's; ``failures``
    those with either (cache failures), ``rate`` = ``ids_differ / compared`` (the
    divergence rate). ``off_inconsistent`` and ``on_only`` count prompts (see
    :mod:`sessiongen.analysis.correctness`), ``no_reference`` ON requests whose prompt no
    OFF request sent. ``worst`` is the worst compared ON request (token ids differing
    first, then the largest logprob difference) and ``worst_rows`` every request that
    sent its prompt; ``prompt_table`` has one row per prompt
    (:func:`~sessiongen.analysis.correctness.output_prompts`). ``distinct_outputs`` over
    several prompts equal to 1 means every prompt got the same answer: the probe is
    vacuous.
    """

    logprob_tol: float
    basis: str
    prompts: int
    compared: int
    exercised: int
    evidence: str
    ids_differ: int
    logprob_beyond_tol: int
    divergent: int
    baseline: NoiseBaseline
    rate: float | None
    max_logprob_diff: float | None
    off_inconsistent: int
    on_only: int
    no_reference: int
    distinct_outputs: int
    worst: WorstCase | None
    worst_rows: pl.DataFrame
    prompt_table: pl.DataFrame

    @property
    def failures(self) -> int:
        """Cache failures: pool-served divergences above the noise baseline."""
        return self.baseline.pool_diverged if self.baseline.significant else 0

    @property
    def vacuous(self) -> bool:
        """True when several prompts all got one and the same answer."""
        return self.prompts > 1 and self.distinct_outputs == 1

    @property
    def verdict(self) -> str:
        """One of :data:`sessiongen.analysis.correctness.VERDICTS`."""
        return verdict(
            failures=self.failures,
            off_inconsistent=self.off_inconsistent,
            exercised=self.exercised,
            vacuous=self.vacuous,
            pool_diverged=self.baseline.pool_diverged,
        )


@dataclass(frozen=True)
class Needles:
    """The needle probe of a run, counted against the OFF arm.

    ``graded``: ON requests graded; ``compared``: those whose prompt OFF answered right
    every time; ``exercised``: compared and served from the shared pool; ``wrong``:
    compared and wrong; ``baseline`` tests the pool-served wrong answers against the
    noise (wrong ON answers the pool did not serve, wrong OFF answers);
    ``failures``: the pool-served wrong answers when that test rejects (cache
    failures); ``off_wrong`` prompts the OFF arm missed (a model limit); ``on_only``
    prompts missed in ON that no OFF request sent. ``evidence`` says how pool use is
    known (as in :class:`Equivalence`).
    """

    graded: int
    compared: int
    exercised: int
    evidence: str
    wrong: int
    baseline: NoiseBaseline
    off_wrong: int
    on_only: int

    @property
    def failures(self) -> int:
        """Cache failures: pool-served wrong answers above the noise baseline."""
        return self.baseline.pool_diverged if self.baseline.significant else 0

    @property
    def verdict(self) -> str:
        """One of :data:`sessiongen.analysis.correctness.VERDICTS` (never vacuous)."""
        return verdict(
            failures=self.failures,
            off_inconsistent=self.off_wrong,
            exercised=self.exercised,
            vacuous=False,
            pool_diverged=self.baseline.pool_diverged,
        )


@dataclass(frozen=True)
class Correctness:
    """A run's correctness: both probes, and the line ``replay`` fails with.

    ``has_off``: the run has OFF answers at all (endpoints measure one arm).
    """

    probe: str
    basis: str
    unkeyed: int
    has_off: bool
    needles: Needles
    equivalence: Equivalence

    @property
    def cache_failures(self) -> int:
        """Needle failures, plus equivalence failures in equivalence runs."""
        eq = self.equivalence.failures if self.probe == "equivalence" else 0
        return self.needles.failures + eq

    def verdict_line(self) -> str | None:
        """One console line: each probe's verdict and what it rests on (None: no probe)."""
        parts = []
        n = self.needles
        if n.graded or n.off_wrong:
            parts.append(f"needles {n.verdict} ({self._grounds(n, 'judged against')})")
        eq = self.equivalence
        if self.probe == "equivalence":
            parts.append(f"equivalence {eq.verdict} ({self._grounds(eq, 'compared with')})")
        return "correctness: " + "; ".join(parts) if parts else None

    def _grounds(self, probe: Needles | Equivalence, how: str) -> str:
        if probe.verdict == NOT_EXERCISED:
            return not_exercised_reason(probe, has_off=self.has_off)
        return (
            f"{probe.failures} cache failures in {probe.compared} ON answers {how} OFF, "
            f"{probe.exercised} served from the pool; {probe.baseline.text()}"
        )

    def failure_line(self) -> str | None:
        """One line naming the cache failures, or None when there are none."""
        parts = []
        if self.needles.failures:
            parts.append(
                f"{self.needles.failures} pool-served needle answers wrong in the ON arm "
                f"where the OFF arm answered the same prompt right: "
                f"{self.needles.baseline.text()}"
            )
        eq = self.equivalence
        if self.probe == "equivalence" and eq.failures:
            parts.append(
                f"{eq.baseline.text()}; token ids differ in {eq.ids_differ} of "
                f"{eq.compared} ON answers, first-token logprob beyond {eq.logprob_tol:g} "
                f"in {eq.logprob_beyond_tol}"
            )
        return "cache failures: " + "; ".join(parts) if parts else None


def _count(frame: pl.DataFrame, predicate: pl.Expr) -> int:
    return int(frame.select(predicate.fill_null(False).sum()).item())


def _worst(judged: pl.DataFrame, keyed: pl.DataFrame) -> tuple[WorstCase | None, pl.DataFrame]:
    """The worst compared ON request and every request that sent its prompt."""
    compared = judged.filter(pl.col("verdict").is_in([AGREES, DIVERGED]))
    empty = keyed.clear().select(*GROUP_KEYS, *WORST_ROW_COLUMNS)
    if compared.is_empty():
        return None, empty
    ranked = compared.sort(
        "ids_differ", "logprob_diff", descending=True, nulls_last=True, maintain_order=True
    )
    worst = ranked.row(0, named=True)
    rows = keyed.filter(
        pl.col("prompt_key") == worst["prompt_key"], pl.col("output_digest").is_not_null()
    )
    case = WorstCase(
        placement=str(worst["placement"]),
        context_tokens=int(worst["context_tokens"]),
        session_id=str(worst["session_id"]),
        turn=int(worst["turn"]),
        block=int(worst["block"]),
        output_digest=worst["output_digest"],
        off_digests=worst["off_digests"],
        ids_differ=bool(worst["ids_differ"]),
        logprob_diff=worst["logprob_diff"],
    )
    return case, rows.select(*GROUP_KEYS, *WORST_ROW_COLUMNS).sort("block", "cache")


def _evidence(rows: pl.DataFrame) -> str:
    """How pool use of the compared ON requests is known: request, block or none."""
    kinds = set(rows["pool_evidence"].drop_nulls().to_list())
    return "request" if kinds == {"request"} else "block" if kinds else "none"


def summarize_equivalence(keys: KeyedRequests, logprob_tol: float = LOGPROB_TOL) -> Equivalence:
    """Sum :func:`judge_outputs` and :func:`output_prompts` up (see :class:`Equivalence`)."""
    judged = judge_outputs(keys.rows, logprob_tol)
    prompts = output_prompts(keys.rows, logprob_tol)
    compared = judged.filter(pl.col("verdict").is_in([AGREES, DIVERGED]))
    n_ids = _count(compared, pl.col("ids_differ"))
    off_pairs = off_self_disagreements(keys.rows, logprob_tol)
    baseline = _baseline(compared, pl.col("diverged"), off_pairs)
    max_diff = compared.select(pl.col("logprob_diff").max()).item()
    worst, worst_rows = _worst(judged, keys.rows)
    return Equivalence(
        logprob_tol=logprob_tol,
        basis=keys.basis,
        prompts=prompts.height,
        compared=compared.height,
        exercised=_count(compared, pl.col("pool_served")),
        evidence=_evidence(compared),
        ids_differ=n_ids,
        logprob_beyond_tol=_count(compared, pl.col("logprob_beyond_tol")),
        divergent=_count(compared, pl.col("diverged")),
        baseline=baseline,
        rate=n_ids / compared.height if compared.height else None,
        max_logprob_diff=None if max_diff is None else float(max_diff),
        off_inconsistent=_count(prompts, pl.col("off_inconsistent")),
        on_only=_count(prompts, pl.col("on_only")),
        no_reference=_count(judged, pl.col("verdict") == NO_OFF),
        distinct_outputs=keys.rows["output_digest"].drop_nulls().n_unique(),
        worst=worst,
        worst_rows=worst_rows,
        prompt_table=prompts,
    )


def summarize_needles(keys: KeyedRequests) -> Needles:
    """Sum :func:`judge_needles` up (see :class:`Needles`)."""
    judged = judge_needles(keys.rows)
    on = judged.filter(pl.col("cache") == "on")
    compared = on.filter(pl.col("verdict").is_in([AGREES, DIVERGED]))
    missed = ~pl.col("answer_correct")
    off_missed = judged.filter(pl.col("cache") == "off", missed)
    on_only = on.filter(pl.col("verdict") == NO_OFF, missed)
    wrong = pl.col("verdict") == DIVERGED
    return Needles(
        graded=on.height,
        compared=compared.height,
        exercised=_count(compared, pl.col("pool_served")),
        evidence=_evidence(compared),
        wrong=_count(compared, wrong),
        baseline=_baseline(compared, wrong, needle_off_misses(keys.rows)),
        off_wrong=off_missed["prompt_key"].n_unique(),
        on_only=on_only["prompt_key"].n_unique(),
    )


def _baseline(compared: pl.DataFrame, diverged: pl.Expr, off: tuple[int, int]) -> NoiseBaseline:
    """Pool-served divergences of ``compared`` against the rest plus the OFF arm's own."""
    pool = compared.filter(pl.col("pool_served").fill_null(False))
    rest = compared.filter(~pl.col("pool_served").fill_null(False))
    return NoiseBaseline.of(
        (pool.height, _count(pool, diverged)),
        (rest.height + off[0], _count(rest, diverged) + off[1]),
    )


def correctness(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> Correctness:
    """Judge a run's answers against the OFF arm, per probe (module docstring)."""
    keys = keyed_requests(run)
    return Correctness(
        probe=run.probe,
        basis=keys.basis,
        unkeyed=keys.unkeyed,
        has_off=bool((keys.rows["cache"] == "off").any()),
        needles=summarize_needles(keys),
        equivalence=summarize_equivalence(keys, logprob_tol),
    )


def equivalence(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> Equivalence:
    """The equivalence probe of a run (:class:`Equivalence`)."""
    return summarize_equivalence(keyed_requests(run), logprob_tol)


def divergences(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Every ON request with an output, judged against OFF's answer to the same prompt.

    One row per ON request (:func:`judge_outputs`): ``diverged`` when its token ids or
    first-token logprob differ from the OFF answer, ``verdict`` says why it was or was
    not judged.
    """
    judged = judge_outputs(keyed_requests(run).rows, logprob_tol)
    return judged.sort(*GROUP_KEYS, "block")


def divergence_counts(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Per placement, context and turn: ON requests compared with OFF, diverged, and why."""
    judged = judge_outputs(keyed_requests(run).rows, logprob_tol)
    compared = judged.filter(pl.col("verdict").is_in([AGREES, DIVERGED]))
    return (
        compared.group_by("placement", "context_tokens", "turn")
        .agg(
            compared=pl.len(),
            diverged=pl.col("diverged").sum(),
            pool_diverged=(pl.col("diverged") & pl.col("pool_served")).sum(),
            ids_differ=pl.col("ids_differ").sum(),
            logprob_beyond_tol=pl.col("logprob_beyond_tol").sum(),
            max_logprob_diff=pl.col("logprob_diff").max(),
            exercised=pl.col("pool_served").sum(),
        )
        .sort("placement", "context_tokens", "turn")
    )


CELL_COUNTS: dict[str, pl.DataType] = {
    "divergences": pl.UInt32(),
    "pool_divergences": pl.UInt32(),
    "cache_failures": pl.UInt32(),
    "off_inconsistent": pl.UInt32(),
    "on_only": pl.UInt32(),
}


def _row_flags(
    keys: KeyedRequests, probe: str, logprob_tol: float, failing: tuple[bool, bool]
) -> pl.DataFrame:
    """Every usable request with its correctness flags (``_div``, ``_fail``, ``_off``,
    ``_on_only``): the per-row truth :func:`correctness_cells` counts. ``failing``:
    whether the needle and the equivalence probe found cache failures (pool-served
    divergences above the noise), without which no row is one."""
    equivalence_run = probe == "equivalence"
    needles_fail, outputs_fail = failing
    outputs = judge_outputs(keys.rows, logprob_tol).select("_i", _div=pl.col("verdict") == DIVERGED)
    needles = judge_needles(keys.rows).select(
        "_i", _needle=pl.col("verdict"), _right=pl.col("answer_correct")
    )
    prompts = output_prompts(keys.rows, logprob_tol).select(
        "prompt_key", _off_bad="off_inconsistent", _on_bad="on_only"
    )
    off = pl.col("cache") == "off"
    pool = pl.col("pool_served").fill_null(False)
    return (
        keys.rows.join(outputs, on="_i", how="left")
        .join(needles, on="_i", how="left")
        .join(prompts, on="prompt_key", how="left")
        .with_columns(
            _div=pl.col("_div").fill_null(False),
            _pool_div=pool
            & (pl.col("_div").fill_null(False) | (pl.col("_needle") == DIVERGED).fill_null(False)),
            _fail=pool
            & (
                ((pl.col("_needle") == DIVERGED).fill_null(False) & needles_fail)
                | (pl.col("_div").fill_null(False) & equivalence_run & outputs_fail)
            ),
            _off=off
            & (
                (pl.col("_off_bad").fill_null(False) & equivalence_run)
                | (~pl.col("_right")).fill_null(False)
            ),
            _on_only=~off
            & (
                (pl.col("_on_bad").fill_null(False) & equivalence_run)
                | ((pl.col("_needle") == NO_OFF) & ~pl.col("_right")).fill_null(False)
            ),
        )
    )


def correctness_cells(run: Run, *, logprob_tol: float = LOGPROB_TOL) -> pl.DataFrame:
    """Per placement, cache, context and turn: the correctness counts of the summary.

    ``divergences``: ON requests whose answer differs from OFF's on the same prompt;
    ``pool_divergences``: those served from the pool, needle misses included;
    ``cache_failures``: pool-served ON requests wrong where OFF was right (needles, and
    divergences in equivalence runs) in a probe whose pool-served rate is above the noise
    baseline (:class:`NoiseBaseline`); ``off_inconsistent``: prompts (on OFF rows) whose OFF answers
    disagree or miss; ``on_only``: prompts (on ON rows) without an OFF answer whose ON
    answers disagree or miss.
    """
    keys = keyed_requests(run)
    failing = (
        summarize_needles(keys).failures > 0,
        summarize_equivalence(keys, logprob_tol).failures > 0,
    )
    keys = KeyedRequests(keys.rows.with_row_index("_i"), keys.basis, keys.unkeyed)
    flags = _row_flags(keys, run.probe, logprob_tol, failing)
    key = pl.col("prompt_key")
    return (
        flags.group_by(list(CELL_KEYS))
        .agg(
            divergences=pl.col("_div").sum(),
            pool_divergences=pl.col("_pool_div").sum(),
            cache_failures=pl.col("_fail").sum(),
            off_inconsistent=key.filter(pl.col("_off")).n_unique(),
            on_only=key.filter(pl.col("_on_only")).n_unique(),
        )
        .with_columns(pl.col(name).cast(dtype) for name, dtype in CELL_COUNTS.items())
        .sort(list(CELL_KEYS))
    )


def not_exercised_reason(eq: Equivalence | Needles, *, has_off: bool) -> str:
    """Why a probe compared no pool-served ON request with a consistent OFF answer.

    Without parentheses: the console line puts it in parentheses after the verdict.
    """
    if not has_off:
        # Endpoints measure one arm; a design may also run ON blocks only.
        return "the run has no OFF arm to compare with"
    if eq.compared == 0:
        return (
            "no prompt was sent in both arms: targets that cannot restart give every block "
            "its own salt, so the prompts of different blocks differ"
        )
    return (
        f"none of the {eq.compared} ON requests compared with OFF was served from the "
        "shared pool, that is by external hits on a cross-replica turn"
    )


__all__ = [
    "BASIS_DIGEST",
    "CELL_COUNTS",
    "NOT_EXERCISED",
    "Correctness",
    "Equivalence",
    "Needles",
    "NoiseBaseline",
    "correctness",
    "correctness_cells",
    "divergence_counts",
    "divergences",
    "equivalence",
    "not_exercised_reason",
]
