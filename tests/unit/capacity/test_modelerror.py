"""The planner's model error: the pure estimate from held-out cells and the shipped default."""

from __future__ import annotations

import math
import tomllib

import numpy as np
import pytest

from sessiongen.capacity import modelerror


def test_a_planted_model_error_is_recovered_with_the_sampling_noise_taken_out() -> None:
    """4,000 cells: a lognormal model error of sigma 0.2 and, on top, each measured gain's
    own sampling error with a standard error between 0.05 and 0.3 (known per cell, as a
    measured interval tells it). The raw root mean square is near 0.26; the estimate
    takes the sampling variance out and gives 0.2 back (its standard error here ~0.004)."""
    rng = np.random.default_rng(31)
    cells = 4000
    se = rng.uniform(0.05, 0.3, cells)
    errors = rng.normal(0.0, 0.2, cells) - rng.normal(0.0, se)
    raw = math.sqrt(float(np.mean(errors**2)))
    assert raw > 0.25
    assert modelerror.sigma_from_errors(errors.tolist(), se.tolist()) == pytest.approx(
        0.2, abs=0.015
    )


def test_errors_the_sampling_noise_explains_give_zero_not_a_negative_variance() -> None:
    rng = np.random.default_rng(5)
    se = np.full(200, 0.3)
    errors = rng.normal(0.0, 0.1, 200)  # smaller than the measurements' own noise
    assert modelerror.sigma_from_errors(errors.tolist(), se.tolist()) == 0.0
    assert math.isnan(modelerror.sigma_from_errors([], []))


def test_a_bias_counts_as_model_error() -> None:
    """A plan that is 20% low on every cell, measured exactly, errs by log(0.8)."""
    errors = [math.log(0.8)] * 10
    assert modelerror.sigma_from_errors(errors, [0.0] * 10) == pytest.approx(-math.log(0.8))


def test_regimes_one_in_flight_only_on_a_closed_loop() -> None:
    assert modelerror.regime(1, closed=True) == "one_in_flight"
    assert modelerror.regime(2, closed=True) == "loaded"
    assert modelerror.regime(1, closed=False) == "loaded"


def test_the_upper_bound_covers_the_planted_error_about_as_often_as_it_says() -> None:
    """400 repetitions of 8 held-out cells (the validation's count), sigma 0.15 planted
    with sampling errors of 0.02-0.4: the 95% bound holds the true sigma in 95% of them
    within the binomial's spread, and is never below the point estimate."""
    rng = np.random.default_rng(7)
    held, below = 0, 0
    for _ in range(400):
        se = rng.uniform(0.02, 0.4, 8)
        errors = rng.normal(0.0, 0.15, 8) - rng.normal(0.0, se)
        bound = modelerror.sigma_upper(errors.tolist(), se.tolist())
        held += bound >= 0.15
        below += bound < modelerror.sigma_from_errors(errors.tolist(), se.tolist()) - 1e-9
    assert 0.91 <= held / 400 <= 0.985 and below == 0


def test_the_upper_bound_is_zero_only_where_the_noise_explains_more_than_the_errors() -> None:
    assert modelerror.sigma_upper([0.01] * 8, [0.3] * 8) == 0.0
    assert math.isnan(modelerror.sigma_upper([], []))
    exact = modelerror.sigma_upper([math.log(0.8)] * 10, [0.0] * 10)
    assert exact > -math.log(0.8)  # a bias in every cell: bounded above it, not at it


def test_the_shipped_default_is_the_bound_of_the_validation_cells_the_file_holds() -> None:
    """The file's [[heldout.cells]] are bench/validation/result.csv's cells (e and se
    recomputed from its planned and measured gains and measured interval), and the
    default is sigma_upper per regime over them."""
    import polars as pl

    from tests.support.paths import ROOT

    rows = tomllib.loads(modelerror.DEFAULTS_FILE.read_text())["heldout"]["cells"]
    table = pl.read_csv(ROOT / "bench" / "validation" / "result.csv")
    assert len(rows) == table.height == 16
    for row, r in zip(rows, table.iter_rows(named=True), strict=True):
        assert (row["kv"], row["placement"], row["context_tokens"], row["load_level"]) == (
            r["kv"], r["placement"], r["context_tokens"], r["load_level"]
        )  # fmt: skip
        e = math.log(r["session_gain_planned"] / r["session_gain_measured"])
        se = math.log(r["session_gain_measured_high"] / r["session_gain_measured_low"]) / (
            2 * 1.959963984540054
        )
        assert row["e"] == pytest.approx(e, abs=1e-6) and row["se"] == pytest.approx(se, abs=1e-6)
        assert row["regime"] == modelerror.regime(r["load_level"], closed=True)
    got = modelerror.default_model_error()
    for name in modelerror.REGIMES:
        mine = [r for r in rows if r["regime"] == name]
        bound = modelerror.sigma_upper([r["e"] for r in mine], [r["se"] for r in mine])
        assert got[name] == bound and got[f"cells_{name}"] == len(mine) == 8
    # Under load the model may stray further than alone; neither is called exact.
    assert 0.05 < got["one_in_flight"] < got["loaded"] < 0.6
    assert "result.csv" in str(got["source"]) and "2026-12-05" in str(got["source"])


def test_the_validation_file_names_its_commit_date_machine_and_command() -> None:
    validation = tomllib.loads(modelerror.DEFAULTS_FILE.read_text())["validation"]
    for key in ("commit", "date", "machine", "command"):
        assert validation[key], key
    assert len(validation["commit"]) == 40


def test_the_closed_form_chi_square_agrees_with_scipy() -> None:
    from scipy.stats import chi2

    for dof in (1, 2, 3, 7, 8, 16, 41):
        for x in (0.1, 1.0, dof * 0.5, float(dof), dof * 2.0):
            assert modelerror.chi2_cdf(x, dof) == pytest.approx(chi2.cdf(x, dof), abs=1e-12)
        for p in (0.05, 0.5, 0.95):
            assert modelerror.chi2_quantile(p, dof) == pytest.approx(chi2.ppf(p, dof), rel=1e-9)
