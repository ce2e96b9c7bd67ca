"""A planted error: on a Mooncake-shaped trace (bench/plan_trace.py's generator,
small), a +-10% error in the prefill cost moves the planned gain far more than the
decode's does, and a verdict that holds at the profile's values but not 10% off it says
so and names prefill_s_per_ktok."""

from __future__ import annotations

import polars as pl
import pytest

from bench.plan_trace import write_trace
from sessiongen.analysis.payoff import with_verdicts
from sessiongen.capacity.grid import configs
from sessiongen.capacity.plan import plan, whatif_rows
from sessiongen.capacity.sensitivity import judge, plan_ends, replicate_zero, with_robustness
from sessiongen.capacity.sweep import SweepOptions

#: 600 requests of the bench's hour, 6.5x faster, on two replicas, alternate placement:
#: the pool-off arm recomputes every moved prefix and queues (gain about 3.4 with the
#: study profile), both arms stable (TTFT growth about 0.006 s/s against the 0.05 limit).
SCENARIO = """
name = "trace-sensitivity"
seed = 21

[model]
tokenizer = "cl100k"

[sessions]
source = "trace"
answer_tokens = 16

[sessions.trace]
file = "trace.jsonl"
block_tokens = 512
speedup = 6.5

[placement]
policies = ["alternate"]

[design]
cache = ["off", "on"]
blocks = ["off", "on"]

[target]
kind = "sim"

[target.sim]
replicas = 2
time_scale = 1.0
profile = "builtin:study"
"""
PARAMETERS = ("prefill_s_per_ktok", "itl_base_s")


@pytest.fixture(scope="module")
def planned(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The trace planned once (replicate 0) and at both ends of the two parameters:
    (what-if rows, the ends' raw rows, replicate 0's)."""
    folder = tmp_path_factory.mktemp("trace")
    write_trace(folder / "trace.jsonl", 600, seed=21)
    toml = folder / "trace.toml"
    toml.write_text(SCENARIO)
    sweep = SweepOptions(jobs=1)  # five small runs: a worker's start-up would dominate
    out = plan(toml, runs_dir=folder / "runs", tokens="shape", sweep=sweep, seeds=1,
               sensitivity=False)  # fmt: skip
    grid = configs(toml, [], [])
    raw = plan_ends(toml, [], [], grid, out, rows=whatif_rows, tokens="shape", sweep=sweep,
                    parameters=PARAMETERS)  # fmt: skip
    return pl.read_parquet(out / "whatif.parquet"), raw, replicate_zero(grid, out, whatif_rows)


def _ratios(raw: pl.DataFrame, zero: pl.DataFrame, parameter: str) -> list[float]:
    base = float(zero["gain_one_base"][0])
    return [g / base for g in raw.filter(pl.col("parameter") == parameter)["gain_one"]]


def test_ten_percent_of_prefill_moves_the_traces_gain_more_than_decode_does(
    planned: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame],
) -> None:
    whatif, raw, zero = planned
    assert whatif.height == 1 and whatif["sessions"][0] >= 5  # units: blocks of time
    assert whatif["stable_off"][0] and whatif["stable_on"][0]
    prefill = _ratios(raw, zero, "prefill_s_per_ktok")
    decode = _ratios(raw, zero, "itl_base_s")
    assert len(prefill) == len(decode) == 2
    assert max(abs(r - 1) for r in prefill) > 0.05
    assert max(abs(r - 1) for r in prefill) > 3 * max(abs(r - 1) for r in decode)


def test_a_verdict_that_holds_only_at_the_profiles_prefill_names_it(
    planned: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame],
) -> None:
    """The threshold is put where the prefill cost's lower-gain end takes the interval's
    lower bound below it and the decode's ends do not (both read off the plan itself,
    so the test holds whatever the interval's width): the cell pays at the profile's
    values, and its verdict says it pays unless prefill_s_per_ktok is 10% off."""
    whatif, raw, zero = planned
    prefill = min(_ratios(raw, zero, "prefill_s_per_ktok"))
    others = min([1.0, *_ratios(raw, zero, "itl_base_s")])
    assert prefill < others
    low = float(whatif["session_gain_low"][0])
    pays_at = low * (prefill + others) / 2
    cell = with_verdicts(whatif, pays_at)
    read = with_robustness(cell, judge(cell, raw, zero))
    assert read["verdict"][0] == "pays"
    assert read["sensitive_to"][0] == "prefill_s_per_ktok"
    text = read["robustness"][0]
    assert text.startswith("pays unless prefill_s_per_ktok is 10% ")
    assert "itl_base_s" not in text
    # and a threshold the whole box clears reads robust
    clear = with_verdicts(whatif, low * min(prefill, others) * 0.9)
    assert with_robustness(clear, judge(clear, raw, zero))["robustness"][0] == (
        "robust: pays at both ends of 2 parameters (+-10%)"
    )
