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


def test_the_shipped_default_is_what_the_validation_file_implies() -> None:
    """Computed here from the file's rows: per regime, the cell-weighted mean of the
    rows' median |error| read on the log scale (atanh: the mean of log(1 + m) and
    -log(1 - m), the sign being lost), over 0.6745."""
    rows = tomllib.loads(modelerror.DEFAULTS_FILE.read_text())["validation"]["cells"]
    got = modelerror.default_model_error()
    for name, levels in (("one_in_flight", {1}), ("loaded", {2, 4})):
        mine = [r for r in rows if r["in_flight"] in levels]
        cells = sum(r["cells"] for r in mine)
        median = sum(math.atanh(r["median_abs_error"]) * r["cells"] for r in mine) / cells
        assert got[name] == pytest.approx(median / 0.6745)
        assert got[f"cells_{name}"] == cells
    assert got["cells_one_in_flight"] == 8 and got["cells_loaded"] == 16
    # Under load the model strays further than alone (README: 7-14% against 12-41%).
    assert 0.1 < got["one_in_flight"] < got["loaded"] < 0.6
    assert "heldout_decision.py" in got["source"] and "2026-12-04" in got["source"]


def test_the_validation_file_names_its_commit_date_machine_and_command() -> None:
    validation = tomllib.loads(modelerror.DEFAULTS_FILE.read_text())["validation"]
    for key in ("commit", "date", "machine", "command"):
        assert validation[key], key
    assert len(validation["commit"]) == 40
