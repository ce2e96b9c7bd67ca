"""The largest trace rate the served pair and the client sustain with every arrival on time.

    .venv/bin/python bench/served_rate.py [--rates 1.7 3.4 5.1] [--seconds 40] \\
        [--replicas 8] [--cache off] [--engine auto] [--no-write]

For each rate, writes ``--seconds`` of a trace of the Mooncake conversation trace's
shape at that rate (one-turn requests, Poisson arrivals, about 12k input tokens and a
few hundred output tokens each, most starting with one of a few shared system prompts)
and replays it through the simulated pair (``--replicas`` replicas in one child
process, one arm, placement by prefix) at ``time_scale`` 1. Every request states its
modeled arrival (``X-Sim-Arrival-S``); the engine records how late each one reached it
(``arrival_late_s``, wall seconds at time_scale 1). A rate
is *sustained* when the p99 of that lateness is under 1% of the median TTFT: the client
got its requests to the engine in time and the engine's loop kept up. Also per rate:
the peak requests in flight (from each record's send time and e2e), the added TTFT
(the client's TTFT less the simulator's own: client, loopback and the server's
lateness together), the achieved rate, failures, the CPU seconds of client and
simulator, and the load average, since the machine is shared.

Figures go to ``docs/data/served-rate.json`` (section ``served``; ``bench/driver_overhead.py
--in-flight`` writes section ``client``) with the commit, date, machine, load and
command, unless ``--no-write``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sessiongen import scenario
from sessiongen.infra.files import atomic_write_json
from sessiongen.records.run import load_run
from sessiongen.replay.orchestrator import ReplayOptions, replay
from sessiongen.sim import compiled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_trace import BLOCK, SCENARIO  # a sibling bench script

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data" / "served-rate.json"
#: Sustained: arrival_late_s p99 under this share of the median TTFT.
ON_TIME_SHARE = 0.01

#: bench/plan_trace.py's scenario, changed to one arm served by the pair (--set style).
SERVED = [
    "design.warmup_requests=0",
    "driver.concurrency=20000",  # every request of the trace in flight if it must be
    "sessions.trace.placement_key=prefix",
]


def write_trace(path: Path, rate: float, seconds: float, seed: int) -> int:
    """One-turn requests at ``rate`` a second for ``seconds`` (module doc); their count."""
    rng = np.random.default_rng(seed)
    systems = [list(range(10 * i, 10 * i + int(rng.integers(2, 10)))) for i in range(4)]
    at, next_id, lines = 0.0, 1000, []
    while True:
        at += float(rng.exponential(1000.0 / rate))
        if at >= 1000.0 * seconds:
            break
        ids = list(systems[int(rng.integers(0, 4))]) if rng.random() < 0.6 else []
        length = len(ids) * BLOCK + int(rng.integers(3000, 19000))
        while len(ids) < -(-length // BLOCK):
            ids.append(next_id)
            next_id += 1
        row = {
            "timestamp": round(at, 1),
            "input_length": length,
            "output_length": int(rng.integers(100, 600)),
            "hash_ids": ids,
        }
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def peak_in_flight(send_s: np.ndarray[Any, Any], e2e_s: np.ndarray[Any, Any]) -> int:
    """Most requests between their send and their end at once."""
    times = np.concatenate([send_s, send_s + e2e_s])
    steps = np.concatenate([np.ones(len(send_s)), -np.ones(len(send_s))])
    order = np.lexsort((steps, times))  # an end before a send at the same instant
    return int(np.cumsum(steps[order]).max(initial=0))


def serve_at(folder: Path, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """Replay ``args.seconds`` of a trace at ``rate`` requests a second; its figures."""
    folder = folder / f"rate-{rate:g}"
    folder.mkdir()
    requests = write_trace(folder / "trace.jsonl", rate, args.seconds, seed=21)
    toml = folder / "served.toml"
    toml.write_text(SCENARIO.format(block=BLOCK, limit=requests, replicas=args.replicas))
    arm = [f'design.cache=["{args.cache}"]', f'design.blocks=["{args.cache}"]']
    load_before = os.getloadavg()
    wall = time.perf_counter()
    cpu = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = replay(
        scenario.load(toml, SERVED + arm), ReplayOptions(runs_dir=folder / "runs", progress=False)
    )
    wall = time.perf_counter() - wall
    # This process is the client; the simulator is a child it has reaped by now.
    client_cpu, server_cpu = (
        _cpu_s(resource.getrusage(who)) - _cpu_s(before)
        for who, before in zip((resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN), cpu, strict=True)
    )
    run = load_run(result.run_dir)
    rows = run.requests.filter(~pl.col("warmup"))
    ok = rows.filter(pl.col("status") == "ok")
    late = ok["arrival_late_s"].drop_nulls()
    ttft = ok["ttft_s"]
    send = ok["send_s"].to_numpy()
    span = float(send.max() - send.min()) if len(send) > 1 else float("nan")
    median_ttft = float(ttft.median() or float("nan"))  # type: ignore[arg-type]
    late_p99 = float(late.quantile(0.99) or 0.0) if len(late) else float("nan")
    # What the client measured beyond the TTFT the simulator gave (runner._server_ttft_s):
    # the client's, the loopback's and the server's own lateness in writing the token.
    added = (ok["ttft_s"] - ok["server_ttft_s"]).drop_nulls() * 1e3
    return {
        "rate_asked": rate,
        "cache": args.cache,
        "seconds": args.seconds,
        "replicas": args.replicas,
        "rate_sent": round((len(send) - 1) / span, 3) if span > 0 else None,
        "requests": rows.height,
        "failed": rows.height - ok.height,
        "stated_arrivals": len(late),
        "arrival_late_p50_s": round(float(late.median() or 0.0), 6),  # type: ignore[arg-type]
        "arrival_late_p99_s": round(late_p99, 6),
        "arrival_late_max_s": round(float(late.max() or 0.0), 6),  # type: ignore[arg-type]
        "ttft_p50_s": round(median_ttft, 4),
        "added_ttft_p50_ms": round(float(added.median() or math.nan), 3),  # type: ignore[arg-type]
        "added_ttft_p99_ms": round(float(added.quantile(0.99) or math.nan), 3),
        "late_p99_over_ttft_p50": round(late_p99 / median_ttft, 5),
        "sustained": bool(len(late) == ok.height > 0 and late_p99 < ON_TIME_SHARE * median_ttft),
        "peak_in_flight": peak_in_flight(send, ok["e2e_s"].to_numpy()),
        "wall_s": round(wall, 1),
        "client_cpu_s": round(client_cpu, 2),
        "server_cpu_s": round(server_cpu, 2),
        "engine": compiled.resolve(args.engine),  # what the child resolves too
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _line(fig: dict[str, Any]) -> str:
    return (
        f"rate {fig['rate_asked']:>5.2f}/s (sent {fig['rate_sent']}/s): {fig['requests']:>5} "
        f"requests, {fig['failed']} failed, peak in flight {fig['peak_in_flight']:>4}; "
        f"arrival late p50 {1e3 * fig['arrival_late_p50_s']:.2f} ms, p99 "
        f"{1e3 * fig['arrival_late_p99_s']:.2f} ms, max {1e3 * fig['arrival_late_max_s']:.1f} ms; "
        f"TTFT p50 {fig['ttft_p50_s']:.3f} s, added p50 {fig['added_ttft_p50_ms']:.2f} ms, p99 "
        f"{fig['added_ttft_p99_ms']:.2f} ms; p99 late / TTFT p50 "
        f"{100 * fig['late_p99_over_ttft_p50']:.3f}% -> "
        f"{'sustained' if fig['sustained'] else 'NOT sustained'}; {fig['wall_s']} s wall, "
        f"CPU client {fig['client_cpu_s']} s, simulator {fig['server_cpu_s']} s "
        f"({fig['engine']} engine); load {fig['load_before'][0]:.2f} -> "
        f"{fig['load_after'][0]:.2f}"
    )


def machine() -> str:
    return f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}"


def provenance(command: str) -> dict[str, Any]:
    """The commit, date, machine, load average and command a figure came from."""
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "command": command,
        "commit": sha,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def update_data(section: str, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Merge ``rows`` (each with its provenance) into ``section`` of
    ``docs/data/served-rate.json``, keeping the section's other rows; the section."""
    data: dict[str, Any] = {}
    if DATA.exists():
        data = json.loads(DATA.read_text(encoding="utf-8"))
    merged = {**data.get(section, {}).get("rows", {}), **rows}
    data[section] = {"rows": dict(sorted(merged.items()))}
    if section == "served":
        data[section]["largest_rate_sustained"] = largest_sustained(list(merged.values()))
    atomic_write_json(DATA, stamped(data, newest=next(iter(rows.values()))))
    print(f"wrote {DATA.relative_to(ROOT)} [{section}]")
    return dict(data[section])


def stamped(data: dict[str, Any], *, newest: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the docs' common head (docs/figures.py): the ``newest`` row's commit,
    date, machine and load (a row this run wrote), both benches' commands, and flat
    ``figures`` the docs quote (``served.ARM_NR_ENGINE.largest_rate``,
    ``client.in_flight_N.added_ttft_p99_ms``...); every row keeps its own provenance."""
    figures: dict[str, Any] = {}
    for config, rate in data.get("served", {}).get("largest_rate_sustained", {}).items():
        figures[f"served.{config.replace('-', '_')}.largest_rate"] = rate
    for name, row in data.get("served", {}).get("rows", {}).items():
        key = "served." + name.replace("-", "_").replace(".", "_")
        for column in ("peak_in_flight", "arrival_late_p99_s", "ttft_p50_s", "load_before"):
            if row.get(column) is not None:
                figures[f"{key}.{column}"] = row[column]
    for name, row in data.get("client", {}).get("rows", {}).items():
        key = "client." + name.replace("-", "_")
        for column in (
            "added_ttft_p50_ms",
            "added_ttft_p99_ms",
            "added_ttft_max_ms",
            "load_before",
        ):
            if row.get(column) is not None:
                figures[f"{key}.{column}"] = row[column]
    head = {
        "command": "python bench/served_rate.py; python bench/driver_overhead.py --in-flight 1000",
        "run_id": f"served-rate {newest['date']} (each row's own run beside it)",
        "commit": newest["commit"],
        "date": newest["date"],
        "machine": newest["machine"],
        "load_average_after": newest["load_average"],
        "figures": figures,
    }
    return {**data, **head}


def largest_sustained(rows: Collection[dict[str, Any]]) -> dict[str, float | None]:
    """Per arm, replica count and engine, the largest rate sustained and below every rate
    that was not (a rate held only above one that failed is not counted)."""
    out: dict[str, float | None] = {}
    for key in sorted({_setup(r) for r in rows}):
        arm = sorted((r for r in rows if _setup(r) == key), key=_rate)
        held = None
        for r in arm:
            if not r["sustained"]:
                break
            held = r["rate_asked"]
        out[key] = held
    return out


def _setup(row: dict[str, Any]) -> str:
    return f"{row['cache']}-{row['replicas']}r-{row['engine']}"


def _rate(row: dict[str, Any]) -> float:
    return float(row["rate_asked"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[1.7, 3.4, 5.1])
    ap.add_argument("--seconds", type=float, default=40.0, help="wall seconds of arrivals")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--cache", choices=["off", "on"], default="off")
    ap.add_argument("--engine", choices=list(compiled.ENGINES), default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.engine != "auto":
        os.environ[compiled.ENV] = args.engine  # the simulator's child process reads it
    print(f"load average before: {os.getloadavg()} on {machine()}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for rate in sorted(args.rates):
            rows.append(serve_at(folder, rate, args))
            print(_line(rows[-1]), flush=True)
    print(f"largest rate sustained here: {largest_sustained(rows)} requests a second")
    print(f"load average after: {os.getloadavg()}")
    if not args.no_write:
        command = "python bench/served_rate.py " + " ".join(sys.argv[1:])
        keyed = {f"{_setup(r)}-{r['rate_asked']:g}": {**r, **provenance(command)} for r in rows}
        section = update_data("served", keyed)
        print(f"largest rate sustained, all rows: {section['largest_rate_sustained']}")


if __name__ == "__main__":
    main()
