"""The bootstrap's resampling on counts gives the figures of resampling the values.

:func:`sessiongen.analysis.stats._resample_stat` reads each draw's quantile from the
values sorted once, weighted by how often the draw took their unit; the
reference here copies the drawn values and takes ``np.nanquantile`` of each row, as the
resampling did before. Both must agree to the bit, by either search (a binary search for
few wide units, a running count for many narrow ones).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sessiongen.analysis import stats


def drawn_quantiles(
    mats: list[np.ndarray], q: float, n_resamples: int, rng: np.random.Generator
) -> list[np.ndarray]:
    n_units = mats[0].shape[0]
    width = sum(m.shape[1] for m in mats)
    chunk = max(1, stats._CHUNK_ELEMENTS // max(1, n_units * width))
    out: list[list[np.ndarray]] = [[] for _ in mats]
    done = 0
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        idx = rng.integers(0, n_units, size=(size, n_units))
        for slot, mat in enumerate(mats):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a draw of NaN only
                out[slot].append(np.nanquantile(mat[idx].reshape(size, -1), q, axis=1))
        done += size
    return [np.concatenate(parts) for parts in out]


@pytest.mark.parametrize("chunk_elements", [stats._CHUNK_ELEMENTS, 64])
def test_counts_match_the_drawn_values(
    monkeypatch: pytest.MonkeyPatch, chunk_elements: int
) -> None:
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", chunk_elements)
    gen = np.random.default_rng(7)
    for trial in range(120):
        n = int(gen.integers(1, 40))
        width = int(gen.integers(1, 5))
        q = float(gen.choice([0.1, 0.5, 0.9, 0.37]))
        mats = []
        for _ in range(int(gen.integers(1, 3))):
            # rounded: ties; NaN: units missing values, or every value of some units
            mat = np.round(gen.exponential(1.0, (n, width)), int(gen.integers(0, 3)))
            mat[gen.random((n, width)) < gen.choice([0.0, 0.3, 0.95])] = np.nan
            mats.append(mat)
        draws = int(gen.integers(1, 200))
        want = drawn_quantiles(mats, q, draws, np.random.default_rng(trial))
        got = stats._resample_stat(mats, q, draws, np.random.default_rng(trial))
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w)


def test_a_ratio_interval_is_unchanged_for_its_seed() -> None:
    gen = np.random.default_rng(3)
    off = gen.lognormal(0.5, 0.4, (30, 6))
    on = off / gen.lognormal(0.3, 0.2, (30, 6))
    on[gen.random(on.shape) < 0.2] = np.nan
    got = stats.bootstrap_ratio(off, on, paired=True, seed=11)
    rng = np.random.default_rng(11)
    a, b = drawn_quantiles([off, on], 0.5, 2000, rng)
    low, high = np.quantile(a / b, [0.025, 0.975])
    assert (got.low, got.high) == (float(low), float(high))
