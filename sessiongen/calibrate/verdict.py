"""What a calibration says, in words: the verdict first, then the figures, grouped.

The verdict names what the client adds to a TTFT at the median and at the highest tail
the sample can honestly state (the early-stopping p99, else p90: see
:mod:`sessiongen.calibrate.measure`), and the smallest TTFT for which that tail is
under 1% and 2% of it (:data:`DEFINITION`). Every tail is shown with its sample count,
or as ``n/a (20 of 662 needed; max 4.1 ms)`` where the sample is too small.

Pure functions of the flat figures :func:`~sessiongen.calibrate.measure.calibrate`
returns (and the manifest keeps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sessiongen.analysis.tails import min_samples

#: The shares of a TTFT the verdict checks the client's added time against.
LEVELS = (0.01, 0.02)
#: The tails the verdict may state, highest first.
TAILS = ((0.99, "p99"), (0.90, "p90"))

DEFINITION = (
    "Fine above T at the 1% level: for every TTFT of at least T, the client adds under 1% "
    "of it on all but the stated tail's share of requests (T = the added time at that "
    "tail / 0.01; likewise at 2%)."
)


def verdict(fig: Mapping[str, Any]) -> str:
    """One sentence: what the client adds at p50 and at its highest honest tail, and the
    smallest TTFTs for which that is under 1% and 2% (see :data:`DEFINITION`)."""
    n = int(fig.get("requests") or 0)
    p50 = _number(fig.get("added_ttft_p50_ms"))
    if not n or p50 is None:
        return f"no verdict: no request was measured ({fig.get('failed', 0)} failed)"
    load = f"at this load ({fig.get('concurrency')} streams, {_kib(fig.get('body_bytes'))})"
    stated = _stated_tail(fig)
    if stated is None:
        return (
            f"the client adds {_ms(p50)} at p50 ({n} requests: too few for a tail, a p90 "
            f"needs {min_samples(0.90)}) {load}: under 1% of TTFTs above {_ms(p50 / 0.01)} "
            f"for half of the requests only; {_longer(fig, 0.90)}"
        )
    name, value, p = stated
    limits = " and ".join(
        f"above {_ms(value / level)} at the {level:.0%} level" for level in LEVELS
    )
    more = "" if p == TAILS[0][0] else f"; {_longer(fig, TAILS[0][0])}"
    return (
        f"the client adds {_ms(p50)} at p50 and at most {_ms(value)} at {name} ({n} requests) "
        f"{load}: fine for TTFTs {limits}{more}"
    )


def figure_lines(fig: Mapping[str, Any]) -> list[str]:
    """The figures, grouped (steady state, burst, event loop, stream rate), each with its
    unit and every tail with its sample count."""
    n, burst_n = int(fig.get("requests") or 0), int(fig.get("burst_requests") or 0)
    own = int(fig.get("requests_own") or 0)
    return [
        f"steady state: {fig.get('concurrency')} closed-loop streams for "
        f"{_number(fig.get('steady_duration_s')) or 0:g} s, {n} requests measured "
        f"({fig.get('failed', 0)} failed), the server answering after "
        f"{_number(fig.get('server_delay_ms')) or 0:g} ms",
        "  added TTFT: " + _spread(fig, "added_ttft", n, tails=(0.90, 0.99)),
        "  added TTFT without stalls spent waiting for a CPU: "
        + (
            _spread(fig, "added_ttft", own, tails=(0.99,), suffix="_own", median=False)
            if own
            else "no such request (a stall reached into every one)"
        ),
        "  upstream (writing the request, loopback): " + _spread(fig, "upstream", n),
        "  downstream (delivery, wake-up, parsing): " + _spread(fig, "downstream", n),
        f"burst: {fig.get('burst_rounds', '?')} waves of {fig.get('concurrency')} requests "
        f"released at once, {burst_n} measured ({fig.get('burst_failed', 0)} failed)",
        "  added TTFT: " + _spread(fig, "burst_added_ttft", burst_n, tails=(0.90, 0.99)),
        "event loop (steady): " + _lag(fig, "", n),
        "event loop (burst): " + _lag(fig, "burst_", burst_n),
        f"stream rate: {_count(fig.get('stream_chunks_per_cpu_s'))} chunks per CPU second "
        f"on one core ({_number(fig.get('stream_chunks_per_read')) or math.nan:.2f} chunks "
        f"per read; near 1, each chunk paid its own read), "
        f"{_count(fig.get('stream_chunks_per_s'))} chunks/s wall over "
        f"{fig.get('stream_streams', '?')} streams",
    ]


def tail_text(value: Any, n: int, p: float, maximum: Any) -> str:
    """``1.3 ms (n=1280)``, or ``n/a (20 of 662 needed; max 4.1 ms)`` below the count an
    early-stopping estimate needs."""
    if not n:
        return "-"
    got = _number(value)
    if got is not None:
        return f"{_ms(got)} (n={n})"
    top = _number(maximum)
    return f"n/a ({n} of {min_samples(p)} needed; max {_ms(top) if top is not None else '-'})"


def _stated_tail(fig: Mapping[str, Any]) -> tuple[str, float, float] | None:
    for p, name in TAILS:
        value = _number(fig.get(f"added_ttft_{name}_ms"))
        if value is not None:
            return name, value, p
    return None


def _longer(fig: Mapping[str, Any], p: float) -> str:
    """How long a steady state would give the ``p`` tail, from the request rate seen."""
    needed = min_samples(p)
    n, duration = int(fig.get("requests") or 0), _number(fig.get("steady_duration_s"))
    name = f"p{round(p * 100)}"
    if not n or not duration:
        return f"a {name} needs {needed} requests"
    seconds = math.ceil(needed / (n / duration) * 1.1)  # 10% for the cycle lost at start
    return f"a {name} needs {needed} requests (sessiongen calibrate --duration {seconds})"


def _spread(
    fig: Mapping[str, Any],
    name: str,
    n: int,
    *,
    tails: tuple[float, ...] = (0.99,),
    suffix: str = "",
    median: bool = True,
) -> str:
    parts = [f"p50 {_ms(_number(fig.get(f'{name}_p50_ms')))}"] if median else []
    for p in tails:
        key = f"{name}_p{round(p * 100)}{suffix}_ms"
        parts.append(
            f"p{round(p * 100)} {tail_text(fig.get(key), n, p, fig.get(f'{name}_max{suffix}_ms'))}"
        )
    parts.append(f"max {_ms(_number(fig.get(f'{name}_max{suffix}_ms')))}")
    return ", ".join(parts)


def _lag(fig: Mapping[str, Any], prefix: str, n: int) -> str:
    stalls, preempted = fig.get(f"{prefix}lag_stalls", 0), fig.get(f"{prefix}lag_preempted", 0)
    return (
        f"max lag {_ms(_number(fig.get(f'{prefix}lag_max_ms')))}; {stalls} stalls over 1 ms "
        f"({preempted} mostly waiting for a CPU); {fig.get(f'{prefix}lag_flagged', 0)} of "
        f"{n} requests lag-flagged (stalls over 2% of their TTFT)"
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _ms(value: float | None) -> str:
    """Milliseconds as a reader wants them: 0.42 ms, 1.3 ms, 130 ms, 1.3 s."""
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g} s"
    if abs(value) >= 10:
        return f"{value:.0f} ms"
    return f"{value:.2g} ms" if abs(value) >= 1 else f"{value:.2f} ms"


def _kib(value: Any) -> str:
    got = _number(value)
    return "? KiB bodies" if got is None else f"{got / 1024:.0f} KiB bodies"


def _count(value: Any) -> str:
    got = _number(value)
    return "-" if got is None else f"{got:,.0f}"
