"""Sensitivity at a glance: the box each profile parameter gets, and how a cell's verdict
is read at its ends (the cell's estimate moved by the parameter; robust, or which
parameter flips it and which way)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from sessiongen import scenario
from sessiongen.analysis.whatif import Vary
from sessiongen.capacity.sensitivity import (
    SENSITIVITY_COLUMNS,
    console_lines,
    ends,
    judge,
    profile_intervals,
    with_robustness,
)
from tests.support.paths import ROOT

SMOKE = ROOT / "scenarios" / "smoke.toml"


def test_an_unfitted_profile_gets_ten_percent_each_way_and_zeros_are_skipped() -> None:
    sim = scenario.load(SMOKE, ["target.sim.profile=builtin:study"]).target.sim
    box = ends(sim)
    names = list(dict.fromkeys(e.parameter for e in box))
    assert names == [
        "prefill_s_per_ktok",
        "attn_s_per_ktok2",
        "pool_bandwidth_gbps",
        "pool_load_fixed_s",
        "hit_overhead_s",
        "itl_base_s",
        "itl_per_ktok_s",
        "itl_per_batch_s",
    ]  # pool_store_s_per_gb and prefill_noise_sigma are 0 in the study profile
    low, high = (e for e in box if e.parameter == "prefill_s_per_ktok")
    assert (low.end, high.end) == ("low", "high")
    assert low.value == pytest.approx(0.136 * 0.9) and high.value == pytest.approx(0.136 * 1.1)
    assert low.change == pytest.approx(-0.1) and not low.fitted
    assert low.setting == f"target.sim.prefill_s_per_ktok={0.136 * 0.9!r}"
    overhead = next(e for e in box if e.parameter == "hit_overhead_s" and e.end == "high")
    assert overhead.value == pytest.approx(tuple(v * 1.1 for v in sim.hit_overhead_s))
    assert overhead.setting.startswith("target.sim.hit_overhead_s=[0.0, 0.0363")
    wide = ends(sim, span=0.25, skip=["prefill_s_per_ktok"])
    assert "prefill_s_per_ktok" not in {e.parameter for e in wide}
    assert wide[0].change == pytest.approx(-0.25)


PROFILE = """
[target.sim]
prefill_s_per_ktok = 0.1
attn_s_per_ktok2 = 0.001
pool_bandwidth_gbps = 5.0
hit_overhead_tokens = [0, 8000]
hit_overhead_s = [0.0, 0.05]

[fit.interval]
prefill_s_per_ktok = [0.08, 0.13]
attn_s_per_ktok2 = [0.002, 0.003]          # does not hold the value: not usable
pool_bandwidth_gbps = [4.0, 7.0]
hit_overhead_s = [[0.0, 0.04], [0.0, 0.07]]
"""


def test_a_fitted_profile_gives_its_intervals_where_they_hold_the_value(tmp_path: Path) -> None:
    profile = tmp_path / "fitted.toml"
    profile.write_text(PROFILE)
    sim = scenario.load(SMOKE, [f"target.sim.profile={profile}"]).target.sim
    assert set(profile_intervals(sim)) == {
        "prefill_s_per_ktok",
        "pool_bandwidth_gbps",
        "hit_overhead_s",
    }
    box = {(e.parameter, e.end): e for e in ends(sim)}
    assert box["prefill_s_per_ktok", "low"].value == 0.08
    assert box["prefill_s_per_ktok", "high"].change == pytest.approx(0.3)
    assert box["prefill_s_per_ktok", "low"].source(0.1) == "fit interval"
    assert box["attn_s_per_ktok2", "high"].value == pytest.approx(0.0011)  # the span instead
    assert box["hit_overhead_s", "high"].value == (0.0, 0.07)
    # a value the scenario sets over the file's is not the fit's: its interval does not apply
    mine = scenario.load(
        SMOKE, [f"target.sim.profile={profile}", "target.sim.prefill_s_per_ktok=0.12"]
    ).target.sim
    assert "prefill_s_per_ktok" not in profile_intervals(mine)
    assert [e.value for e in ends(mine) if e.parameter == "prefill_s_per_ktok"] == [
        pytest.approx(0.108),
        pytest.approx(0.132),
    ]


def test_a_profile_without_intervals_is_read_as_unfitted(tmp_path: Path) -> None:
    profile = tmp_path / "plain.toml"
    profile.write_text(PROFILE.split("[fit.interval]")[0])
    sim = scenario.load(SMOKE, [f"target.sim.profile={profile}"]).target.sim
    assert profile_intervals(sim) == {}
    assert not any(e.fitted for e in ends(sim))


CELL = {"config": 0, "label": "as given", "placement": "alternate", "context_tokens": 2048}


def _whatif(*cells: tuple[float, float, float, float, str]) -> pl.DataFrame:
    """Cells (level, gain, low, high, verdict) of one configuration, both arms stable."""
    rows = []
    for level, gain, low, high, verdict in cells:
        figures = {"session_gain": gain, "session_gain_low": low, "session_gain_high": high}
        rows.append(
            {**CELL, "load_level": level, **figures, "sessions": 40, "stable_off": True,
             "stable_on": True, "verdict": verdict, "pays_at": 1.1}
        )  # fmt: skip
    return pl.DataFrame(rows)


def _end(
    level: float, parameter: str, end: str, ratio: float, **extra: object
) -> dict[str, object]:
    """An end's raw row (plan_ends'): replicate 0 gains 2.0, the end ``2.0 * ratio``."""
    row = {
        "config": 0, "placement": "alternate", "context_tokens": 2048, "load_level": level,
        "gain_one": 2.0 * ratio, "stable_off": True, "stable_on": True,
        "ttft_growth_off": 0.001, "ttft_growth_on": 0.0, "parameter": parameter, "end": end,
        "source": "+-10%", "setting": f"target.sim.{parameter}=1.0", "base_value": 1.0,
        "value": 0.9 if end == "low" else 1.1, "change": -0.1 if end == "low" else 0.1,
    }  # fmt: skip
    return row | extra


def _zero(*levels: float, stable_off: bool = True) -> pl.DataFrame:
    base = {"gain_one_base": 2.0, "stable_off_base": stable_off, "stable_on_base": True}
    return pl.DataFrame(
        [
            {
                "placement": "alternate",
                "context_tokens": 2048,
                "load_level": level,
                **base,
                "config": 0,
            }
            for level in levels
        ]
    )


def _read(whatif: pl.DataFrame, raw: list[dict[str, object]], zero: pl.DataFrame) -> pl.DataFrame:
    frame = judge(whatif, pl.DataFrame(raw), zero)
    assert frame.columns == ["config", "label", *CELL_KEYS, *SENSITIVITY_COLUMNS]
    return with_robustness(whatif, frame)


CELL_KEYS = ["placement", "context_tokens", "load_level"]


def test_a_cell_that_flips_at_one_end_names_the_parameter_and_a_robust_cell_says_robust() -> None:
    # level 1 pays [1.3, 1.5]: prefill 10% lower takes the gain to 0.7x, [0.91, 1.05]
    # (does not pay); level 2 pays [2.0, 2.4] and no end moves it below 1.1
    whatif = _whatif((1.0, 1.4, 1.3, 1.5, "pays"), (2.0, 2.2, 2.0, 2.4, "pays"))
    raw = [
        _end(1.0, "prefill_s_per_ktok", "low", 0.7),
        _end(1.0, "prefill_s_per_ktok", "high", 1.2),
        _end(1.0, "itl_base_s", "low", 1.01),
        _end(1.0, "itl_base_s", "high", 0.99),
        _end(2.0, "prefill_s_per_ktok", "low", 0.8),
        _end(2.0, "prefill_s_per_ktok", "high", 1.2),
        _end(2.0, "itl_base_s", "low", 1.01),
        _end(2.0, "itl_base_s", "high", 0.99),
    ]
    read = _read(whatif, raw, _zero(1.0, 2.0))
    assert read["robustness"].to_list() == [
        "pays unless prefill_s_per_ktok is 10% below the profile's (does not pay there)",
        "robust: pays at both ends of 2 parameters (+-10%)",
    ]
    assert read["sensitive_to"].to_list() == ["prefill_s_per_ktok", None]


def test_the_ends_carry_the_cells_interval_moved_by_the_parameter() -> None:
    whatif = _whatif((1.0, 1.4, 1.3, 1.5, "pays"))
    raw = [_end(1.0, "prefill_s_per_ktok", "low", 0.7), _end(1.0, "itl_base_s", "low", 1.0)]
    frame = judge(whatif, pl.DataFrame(raw), _zero(1.0))
    first = frame.row(0, named=True)
    assert first["gain_ratio"] == pytest.approx(0.7)
    assert (first["session_gain"], first["session_gain_low"], first["session_gain_high"]) == (
        pytest.approx(0.98),
        pytest.approx(0.91),
        pytest.approx(1.05),
    )
    assert (first["verdict"], first["flips"]) == ("does not pay", True)
    assert frame["sessions"].to_list() == [40, 40]  # the cell's units, not one replicate's
    assert frame.row(1, named=True)["flips"] is False


def test_an_arm_that_turns_unstable_at_an_end_is_near_saturation_with_its_growth() -> None:
    whatif = _whatif((1.0, 3.0, 2.8, 3.2, "pays"))
    raw = [
        _end(1.0, "prefill_s_per_ktok", "low", 0.9),
        _end(1.0, "prefill_s_per_ktok", "high", 1.3, stable_off=False, ttft_growth_off=0.0517),
    ]
    read = _read(whatif, raw, _zero(1.0))
    assert read["robustness"][0] == (
        "near saturation: pays unless prefill_s_per_ktok is 10% above the profile's "
        "(unstable (OFF queue grows) there; OFF TTFT grows 0.0517 s/s, limit 0.05)"
    )
    assert read["sensitive_to"][0] == "prefill_s_per_ktok"


def test_an_arm_already_unstable_at_replicate_zero_is_not_the_parameters_doing() -> None:
    """The pooled cell is stable, replicate 0 alone is not: an end as unstable as
    replicate 0 keeps the cell's stability (the seed did it, not the parameter)."""
    whatif = _whatif((1.0, 3.0, 2.8, 3.2, "pays"))
    raw = [
        _end(1.0, "prefill_s_per_ktok", "low", 1.0, stable_off=False),
        _end(1.0, "prefill_s_per_ktok", "high", 1.0, stable_off=False),
    ]
    read = _read(whatif, raw, _zero(1.0, stable_off=False))
    assert read["robustness"][0].startswith("robust: pays")
    assert read["sensitive_to"][0] is None


def test_an_unstable_cell_that_an_end_steadies_says_which_and_where() -> None:
    whatif = _whatif((1.0, 3.0, 2.8, 3.2, "unstable (OFF queue grows)")).with_columns(
        pl.lit(False).alias("stable_off")
    )
    raw = [
        _end(1.0, "prefill_s_per_ktok", "low", 0.8, stable_off=True),
        _end(1.0, "prefill_s_per_ktok", "high", 1.1, stable_off=False),
    ]
    read = _read(whatif, raw, _zero(1.0, stable_off=False))
    assert read["robustness"][0] == (
        "unstable (OFF queue grows) unless prefill_s_per_ktok is 10% below the profile's "
        "(pays there)"
    )


def test_a_cell_without_ends_is_not_called_robust() -> None:
    whatif = _whatif((1.0, 1.4, 1.3, 1.5, "pays"))
    empty = pl.DataFrame(schema={k: pl.String for k in ("config", *CELL_KEYS)})
    read = with_robustness(whatif, empty.with_columns(pl.col("config").cast(pl.Int64)))
    assert read["robustness"][0].startswith("not checked")
    assert read["sensitive_to"][0] is None


def test_varied_keys_lead_the_frame() -> None:
    whatif = _whatif((1.0, 1.4, 1.3, 1.5, "pays")).with_columns(
        pl.lit("2").alias("target.sim.replicas")
    )
    frame = judge(whatif, pl.DataFrame([_end(1.0, "itl_base_s", "low", 1.0)]), _zero(1.0),
                  [Vary("target.sim.replicas", ("2",))])  # fmt: skip
    assert frame.columns[:3] == ["config", "label", "target.sim.replicas"]


def test_the_console_names_each_cell_and_a_trace_without_its_unused_context_and_level() -> None:
    whatif = _whatif((2.0, 1.4, 1.3, 1.5, "pays")).with_columns(
        pl.lit("robust: pays at both ends of 8 parameters (+-10%)").alias("robustness")
    )
    assert console_lines(whatif)[1:] == [
        "  as given; alternate, context 2048, level 2: robust: pays at both ends of 8 "
        "parameters (+-10%)"
    ]
    trace = whatif.with_columns(pl.lit("time block").alias("unit"))
    assert console_lines(trace)[1] == "  as given; alternate: robust: pays at both ends of 8 " \
        "parameters (+-10%)"  # fmt: skip
    assert console_lines(whatif.drop("robustness")) == []
