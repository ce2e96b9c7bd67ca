"""The pre-registered validation's metric (bench/validation/coverage.py) counts as its
protocol says."""

from __future__ import annotations

import importlib.util

import polars as pl
import pytest

from tests.support.paths import ROOT


def test_coverage_and_verdicts_per_regime() -> None:
    spec = importlib.util.spec_from_file_location("coverage", ROOT / "bench/validation/coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = pl.DataFrame({
        "load_level": [1.0, 1.0, 3.0, 3.0],
        "session_gain_measured": [1.5, 2.0, 1.2, 0.9],
        "session_gain_planned_low": [1.2, 1.0, 1.3, 0.5],
        "session_gain_planned_high": [1.8, 1.9, 1.6, 1.4],
        "session_gain_error": [0.0, -0.2, 0.2, 0.1],
        "verdict_measured": ["pays", "pays", "undecided", "does not pay"],
        "verdict_planned": ["pays", "undecided", "pays", "does not pay"],
    })  # fmt: skip
    out = {r["regime"]: r for r in module.metric(table).iter_rows(named=True)}
    assert (out["one in flight"]["cells"], out["one in flight"]["covered"]) == (2, 1)
    assert (out["loaded"]["covered"], out["all"]["covered"]) == (1, 2)
    assert (out["all"]["decided"], out["all"]["right"], out["all"]["planned_undecided"]) == (
        3,
        2,
        1,
    )
    low, high = module.clopper_pearson(2, 4)
    assert low == pytest.approx(0.0676, abs=1e-4) and high == pytest.approx(0.9324, abs=1e-4)


def test_the_docs_quote_the_validation_as_its_cells_give_it() -> None:
    """docs/benchmarks.md's coverage figures are the metric recomputed from the
    run's cells (bench/validation/result.csv), not typed apart from them."""
    spec = importlib.util.spec_from_file_location("coverage", ROOT / "bench/validation/coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = {
        r["regime"]: r
        for r in module.metric(pl.read_csv(ROOT / "bench/validation/result.csv")).iter_rows(
            named=True
        )
    }
    text = " ".join((ROOT / "docs/benchmarks.md").read_text().split())
    for regime, words in (("one in flight", "at one session in flight"), ("loaded", "loaded"),
                          ("all", "overall")):  # fmt: skip
        r = out[regime]
        quoted = (
            f"{r['covered']} of {r['cells']}"
            + (" cells " if regime == "one in flight" else " ")
            + f"{words} ("
            + ("Clopper-Pearson " if regime == "one in flight" else "")
            + f"[{r['coverage_low']:.2f}, {r['coverage_high']:.2f}])"
        )
        assert quoted in text, quoted
