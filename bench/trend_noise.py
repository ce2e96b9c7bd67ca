"""Benchmark: false alarms and power of the nightly trend check. Prints, asserts nothing.

    .venv/bin/python bench/trend_noise.py [--suites 4] [--nights 30] [--power-seeds 3]

Run with the defaults, it writes its figures to ``docs/data/trend_noise.json`` (the Run
nightly page quotes them from there).

Synthetic suites of 108 series (tests/support/trend_suite.py: 2 placements x 3 context
sizes x 6 turns, TTFT per arm and speedup), checked every night as the nightly job does:

- **false alarms per 100 flat series per night**: nothing changes; every finding counts
  (checks on nights 6..``--nights``). Two kinds of intervals: *narrow* (each night's
  interval sees 40% of the night-to-night SD, its width varies 50% from night to night
  and 5% have zero width: what few sessions per run give) and *honest* (the interval
  matches the night-to-night noise);
- **power**: 14 flat nights, then every series steps 20% or 30% (TTFT up, speedup down);
  the share of series with a regression dated to the step night after 1..5 nights at the
  new level (``--min-nights`` 2: one night is never enough);
- **stored intervals**: 95% intervals expanded for 4 and 8 sessions, as run_summary
  writes them, read by the stored standard error (today) and as plain 95% intervals
  (stores without it, and the check before it);
- **six smoke-like nights** with two loud cells (the false "REGRESSION speedup alternate
  ctx 2048 turn 3"): the share of histories with any finding on nights 4-6.

Night-to-night noise 3% and 5% (log-scale SD). Fixed seeds: the same figures everywhere.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _docs import record

from tests.support.trend_history import Night
from tests.support.trend_suite import false_alarms, power, smoke_like_alarms

CI_SHARE = 0.4  # a narrow interval sees this share of the night-to-night SD
ZERO_WIDTH = 0.05  # share of nights with a zero-width interval (one sample)
STORED_NOISE = 0.05  # night-to-night noise of the stored-intervals suites
STORED_CI_NOISE = 0.04  # the stored intervals' own noise, at that night noise


def pct(share: float) -> int:
    """A share as the whole percent that names it in a figure's key (``noise3``)."""
    return round(100 * share)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", type=int, default=4)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--power-seeds", type=int, default=3)
    parser.add_argument("--smoke-seeds", type=int, default=200)
    args = parser.parse_args()
    started = time.perf_counter()
    figures: dict[str, float] = {
        "settings.ci_share": CI_SHARE,
        "settings.zero_width": ZERO_WIDTH,
        "settings.stored_noise": STORED_NOISE,
        "settings.stored_ci_noise": STORED_CI_NOISE,
    }
    print("false alarms per 100 flat series per night (108-series suites)")
    for noise in (0.03, 0.05):
        honest = Night(noise=noise)
        narrow = replace(honest, ci_noise=CI_SHARE * noise, ci_jitter=0.5, zero_width=ZERO_WIDTH)
        for label, night in (("narrow intervals", narrow), ("honest intervals", honest)):
            found, checks = false_alarms(night, seeds=range(args.suites), nights=args.nights)
            figures[f"false_alarms.noise{pct(noise)}.{label.split()[0]}"] = 100 * found / checks
            print(
                f"  noise {noise:.0%}, {label:<16}: {100 * found / checks:5.2f}"
                f"  ({found} in {checks} series-checks)"
            )
    print("power: share of stepped series found, after 1..5 nights at the new level")
    for noise in (0.03, 0.05):
        night = Night(noise=noise, ci_noise=CI_SHARE * noise, ci_jitter=0.5, zero_width=ZERO_WIDTH)
        for step in (0.2, 0.3):
            shares = power(night, step, seeds=range(args.power_seeds))
            for after, share in enumerate(shares, 1):
                figures[f"power.noise{pct(noise)}.step{pct(step)}.night{after}"] = share
            text = "  ".join(f"{s:4.0%}" for s in shares)
            print(f"  noise {noise:.0%}, {step:.0%} step: {text}")
    print(
        "intervals as run_summary stores them (95% expanded for the session count): power "
        "of a 20% step at 5% night noise, read by the stored standard error and the old way"
    )
    for sessions in (4, 8):
        stored = Night(
            noise=STORED_NOISE, ci_noise=STORED_CI_NOISE, sessions=sessions, interval="expanded"
        )
        for label, night in (
            ("standard error", stored),
            ("as plain 95%", replace(stored, store_se=False)),
        ):
            found, checks = false_alarms(night, seeds=range(args.suites), nights=args.nights)
            shares = power(night, 0.2, seeds=range(args.power_seeds))
            key = f"stored.s{sessions}.{'se' if night.store_se else 'plain'}"
            figures[f"{key}.false_alarms"] = 100 * found / checks
            figures |= {f"{key}.night{after}": share for after, share in enumerate(shares, 1)}
            text = "  ".join(f"{s:4.0%}" for s in shares)
            print(
                f"  {sessions} sessions, {label:<14}: {text}   false alarms "
                f"{100 * found / checks:5.2f} per 100 series-nights"
            )
    alarmed = smoke_like_alarms(range(args.smoke_seeds))
    figures["smoke_like.share"] = alarmed / args.smoke_seeds
    print(
        f"six smoke-like nights: {alarmed / args.smoke_seeds:.1%} of {args.smoke_seeds} "
        "histories with any finding on nights 4-6"
    )
    print(f"({time.perf_counter() - started:.0f} s)")
    record("trend_noise", figures, args=args, documented=parser.parse_args([]))


if __name__ == "__main__":
    main()
