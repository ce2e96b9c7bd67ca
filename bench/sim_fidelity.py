"""How closely the simulated pair's wall clock follows its model, as a replay measures it.

A simulated run compresses modeled time by the time scale (wall s per modeled s), so any
lateness of the client or the simulator, in wall seconds, becomes lateness / scale
modeled seconds. This prints, per request kind and time scale, the measurement error
the replay's own driver sees: client TTFT minus the simulator's modeled TTFT (both in
modeled seconds), as a share of the modeled TTFT (median, p90, worst).

    .venv/bin/python bench/sim_fidelity.py [--repeats 5] [--scales 0.02,0.05,0.1,0.2]

The simulator runs in its own process (as in a replay); requests go one at a time
through :class:`sessiongen.client.driver.Client`. Nothing is asserted: the figures
depend on the machine and on what else runs on it (say so when you quote them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics

import numpy as np
import orjson

from sessiongen.client.driver import Client
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import start_sim

#: (label, context tokens, how the request meets the caches)
KINDS = (
    ("2k cold", 2_000, "cold"),
    ("2k local", 2_000, "local"),
    ("32k local", 32_000, "local"),
    ("32k cross", 32_000, "cross"),
    ("128k local", 128_000, "local"),
    ("128k cross", 128_000, "cross"),
)


def body(ids: list[int]) -> bytes:
    return orjson.dumps(
        {
            "model": "sim-27b",
            "prompt": ids,
            "max_tokens": 2,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


async def measure(urls: list[str], scale: float, repeats: int) -> dict[str, list[float]]:
    """Relative errors (client - modeled) / modeled per kind."""
    out: dict[str, list[float]] = {label: [] for label, _n, _how in KINDS}
    async with Client(2, 10.0) as client:
        for url in urls:
            await client.prewarm(url, 2)
        for r in range(repeats):
            for k, (label, n, how) in enumerate(KINDS):
                base = (np.arange(n, dtype=np.int64) + (r * len(KINDS) + k + 1) * 10**6).tolist()
                target = urls[0]
                if how != "cold":  # store the prefix first, then ask again with a new tail
                    await client.send(urls[0] + "/v1/completions", body([*base, 1]))
                    target = urls[0] if how == "local" else urls[1]
                res = await client.send(target + "/v1/completions", body([*base, 2]))
                sim = res.server_facts("sim")
                if not res.ok or res.ttft_s is None or "modeled_ttft_s" not in sim:
                    continue
                modeled = float(sim["modeled_ttft_s"])
                out[label].append((res.ttft_s / scale - modeled) / modeled)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scales", default="0.02,0.05,0.1,0.2")
    args = parser.parse_args()
    scales = [float(s) for s in args.scales.split(",")]
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("relative measurement error, (client TTFT - modeled TTFT) / modeled, in %")
    print(f"{'kind':<12}" + "".join(f"  scale {s:<5} p50/p90/max" for s in scales))
    table: dict[str, list[str]] = {label: [] for label, _n, _how in KINDS}
    for scale in scales:
        with start_sim(SimProfile(time_scale=scale), "sim-27b", True) as sim:
            errors = asyncio.run(measure(list(sim.urls), scale, args.repeats))
        for label, vals in errors.items():
            if not vals:
                table[label].append("  (no samples)".ljust(27))
                continue
            p50 = statistics.median(vals) * 100
            p90 = float(np.quantile(vals, 0.9)) * 100
            worst = max(vals) * 100
            table[label].append(f"  {p50:6.2f} /{p90:6.2f} /{worst:6.2f}  ")
    for label, cells in table.items():
        print(f"{label:<12}" + "".join(cells))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
