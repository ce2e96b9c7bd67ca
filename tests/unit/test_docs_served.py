"""The README's sentence on the served pair's sustained trace rate and the client's overhead
at 1,000 requests in flight (issue 34 item 2), rebuilt from ``docs/data/served-rate.json``,
which ``bench/served_rate.py`` and ``bench/driver_overhead.py`` write."""

from __future__ import annotations

from typing import Any

from tests.unit.test_docs_figures import FIGURES, ROOT


def served_sentence(data: dict[str, Any]) -> str:
    f = data["figures"]
    rate = f["served.off_8r_compiled.largest_rate"]
    row = f"served.off_8r_compiled_{f'{rate:g}'.replace('.', '_')}"
    late = f[f"{row}.arrival_late_p99_s"]
    on_time = "no arrival late" if late == 0 else f"arrivals late by {late * 1000:.0f} ms at p99"
    client = "client.in_flight_1000"
    return (
        f"On {data['machine'].split(',')[0]} at time scale 1, the served pair (8 simulated "
        f"replicas on the compiled engine, pool off) and the client held a Mooncake-shaped "
        f"trace at {rate:g} requests a second with {f[f'{row}.peak_in_flight']} requests in "
        f"flight and {on_time} (load average {f[f'{row}.load_before'][0]:g} at the start); "
        f"the client's added TTFT with 1,000 requests in flight was "
        f"{f[f'{client}.added_ttft_p99_ms']:.2f} ms at p99 (load average "
        f"{f[f'{client}.load_before'][0]:g})"
    )


def test_the_readme_quotes_the_served_rate_as_its_data_file_has_it() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    expected = served_sentence(FIGURES.load("served-rate"))
    assert expected in readme, f"README should say: {expected}"


def plan_trace_sentence(data: dict[str, Any]) -> str:
    """The README's sentence on the plan's speed beside Dynamo's offline replay (issue 34
    item 1), rebuilt from ``docs/data/plan-trace.json`` (``bench/plan_trace.py``)."""
    f = data["figures"]
    one, both, dynamo = f["one_arm.wall_s"], f["both_arms.wall_s"], f["dynamo.wall_s"]
    return (
        f"took {one:.2f} s for one cache arm against {dynamo:.2f} s for NVIDIA Dynamo 1.6.1's "
        f"offline replay of the same trace ({dynamo / one:.2f}x), and {both:.2f} s for both "
        f"arms with the decision ({both / dynamo:.2f}x Dynamo's one arm), peak memory "
        f"{max(f['one_arm.peak_mib'], f['both_arms.peak_mib'])} MiB (load average "
        f"{max(f['one_arm.load'], f['both_arms.load'], f['dynamo.load']):g} or less)"
    )


def test_the_readme_quotes_the_plan_speed_as_its_data_file_has_it() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    expected = plan_trace_sentence(FIGURES.load("plan-trace"))
    assert expected in readme, f"README should say: {expected}"
