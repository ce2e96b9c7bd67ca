"""Coverage of a trace's gain interval: requests as units against blocks of time.

    .venv/bin/python bench/trace_blocks.py [--trials 400] [--requests 2000] [--phi 0.9]

A trace's requests share queues, so neighbours in time are slow together. This bench
makes paired OFF / ON request times whose log ratio follows an AR(1) process in arrival
order (``phi``: the correlation of one request with the next; the queue's memory), each
arm with its own request-to-request noise, and computes the gain (median OFF / median
ON) with the paired bootstrap of :func:`sessiongen.analysis.stats.bootstrap_ratio` in
two ways: every request its own unit (what a trace plan did before), and blocks of
consecutive requests of :func:`sessiongen.analysis.timeblocks.block_length` (what it
does now). The true gain is the same ratio on 400,000 requests of the process. Prints
each method's coverage of the truth over ``--trials`` seeded traces, with its
Clopper-Pearson 95% interval, and the median block length. Asserts nothing; the test
tests/unit/analysis/test_timeblocks.py checks the same on a few trials.
"""

from __future__ import annotations

import argparse

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from sessiongen.analysis import stats, timeblocks


def trace(
    rng: np.random.Generator, n: int, phi: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Paired OFF / ON request times (module doc)."""
    shocks = rng.normal(0.0, 1.0, n)
    queue = np.empty(n)
    queue[0] = shocks[0]
    for i in range(1, n):
        queue[i] = phi * queue[i - 1] + np.sqrt(1 - phi * phi) * shocks[i]
    on = np.exp(rng.normal(0.0, 0.3, n))
    off = on * np.exp(0.7 + 0.5 * queue + rng.normal(0.0, 0.2, n))
    return off, on


def covered(
    off: npt.NDArray[np.float64], on: npt.NDArray[np.float64], truth: float, length: int, seed: int
) -> tuple[bool, bool]:
    """Whether the request-unit and the block-unit intervals hold ``truth``."""
    one = stats.bootstrap_ratio(off, on, paired=True, n_resamples=1000, seed=seed, expand=True)
    ids = timeblocks.block_ids(np.arange(off.size), length)
    blocks = int(ids.max()) + 1
    width = int(np.bincount(ids).max())
    a = np.full((blocks, width), np.nan)
    b = np.full((blocks, width), np.nan)
    fill = np.zeros(blocks, dtype=int)
    for i, block in enumerate(ids):
        a[block, fill[block]], b[block, fill[block]] = off[i], on[i]
        fill[block] += 1
    blocked = stats.bootstrap_ratio(a, b, paired=True, n_resamples=1000, seed=seed, expand=True)
    return bool(one.low <= truth <= one.high), bool(blocked.low <= truth <= blocked.high)


def clopper_pearson(hits: int, n: int) -> tuple[float, float]:
    low = float(sps.beta.ppf(0.025, hits, n - hits + 1)) if hits else 0.0
    high = float(sps.beta.ppf(0.975, hits + 1, n - hits)) if hits < n else 1.0
    return low, high


def run(trials: int, requests: int, phi: float, seed: int = 0) -> dict[str, object]:
    """The coverage of both methods (module doc)."""
    rng = np.random.default_rng(seed)
    big_off, big_on = trace(rng, 400_000, phi)
    truth = float(np.median(big_off) / np.median(big_on))
    hits = np.zeros(2, dtype=int)
    lengths = []
    for k in range(trials):
        off, on = trace(rng, requests, phi)
        length = timeblocks.block_length(np.log(off / on))
        lengths.append(length)
        hits += np.array(covered(off, on, truth, length, seed=k))
    return {"truth": truth, "hits": hits.tolist(), "trials": trials,
            "block_length": float(np.median(lengths))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--phi", type=float, default=0.9)
    args = parser.parse_args()
    out = run(args.trials, args.requests, args.phi)
    hits = out["hits"]
    assert isinstance(hits, list)
    print(
        f"{args.requests} requests a trace, AR(1) phi {args.phi}, {args.trials} traces; "
        f"true gain {out['truth']:.4f}; median block length {out['block_length']:g} requests"
    )
    for name, h in zip(("requests as units", "blocks of time"), hits, strict=True):
        low, high = clopper_pearson(int(h), args.trials)
        print(f"  {name:<18} coverage {h / args.trials:.3f} [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
