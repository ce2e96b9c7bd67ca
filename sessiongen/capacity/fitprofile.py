"""A fit written out: the profile TOML file (``[target.sim]`` and ``[fit...]``) and its text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sessiongen.analysis import structure
from sessiongen.capacity.estimate import OVERHEAD
from sessiongen.capacity.fitted import CONFIDENCE, Fit
from sessiongen.infra.files import atomic_write_bytes


def _header_lines(result: Fit) -> list[str]:
    """The values with intervals, what the intervals are over, the designs."""
    lines = []
    for k, v in result.values.items():
        lines.append(f"  {k:<24} {v:12.6g}  {result.interval_text(k)}")
    boot = result.resampling
    if boot is not None:
        if boot.runs > 1:
            unit = (
                f"unit: run, then session ({boot.runs} runs; {boot.sessions} sessions "
                f"resampled within each run, context size and cache arm, {boot.strata} "
                "strata)"
            )
        else:
            unit = (
                f"unit: session ({boot.sessions} sessions, resampled within each of "
                f"{boot.strata} strata: context size and cache arm)"
            )
        lines.append(
            f"intervals: {CONFIDENCE:.0%} percentile bootstrap, {unit}; {boot.resamples} "
            f"resamples, {boot.failed} failed"
        )
    if result.design is not None:
        design = result.design
        for label, ident in (("first token", design.first_token), ("decode", design.decode)):
            lines.append(
                f"design ({label}): {ident.columns} columns, rank {ident.rank}, condition "
                f"number {ident.condition:.3g} (columns at unit length)"
            )
    c = result.values.get(OVERHEAD)
    if c is not None and OVERHEAD not in result.not_identified:
        lines.append(
            f"the profile adds {OVERHEAD} ({c:.4g} s) to hit_overhead_s and "
            "pool_load_fixed_s (the simulator has no per-request term); it models cold "
            "requests short by it"
        )
    return lines


def profile_toml(result: Fit) -> str:
    """The fitted profile as a TOML file: ``[target.sim]``, then what it stands on
    (``[fit]``: provenance; ``[fit.interval]``: each identified key's 95% interval;
    ``[fit.model_error]``, with held-out runs: the model's own error per regime;
    ``[[fit.draw]]``: joint parameter draws), with the fit's report in comments."""
    lines = [
        "# sessiongen simulator profile fitted by `sessiongen fit` (load it with",
        "# --set target.sim.profile=THIS_FILE). Fitted values with their intervals:",
    ]
    lines += [f"# {line}" for line in _header_lines(result)]
    runs = ", ".join(Path(d).name for d in result.sources)  # run ids: no machine's paths
    lines.append(f"# from {result.requests} requests of runs: {runs}")
    lines += [f"# {line}" for line in result.warnings]
    lines += [f"# {line}" for line in _residual_lines(result)]
    lines += [f"# {line}" for line in _loaded_lines(result)]
    missing = structure.unknown(result.fixed)
    if missing:
        lines.append(f"# not told by the runs (set them for your pair): {', '.join(missing)}")
    lines.append("")
    lines.append("[target.sim]")
    for k, v in result.profile().items():
        lines.append(f"{k} = {_toml(v)}")
    lines += ["", "# What the profile stands on (scenario loading reads only [target.sim])."]
    lines += _fit_lines(result)
    draws = result.draws()
    if draws:
        lines += [
            "",
            f"# {len(draws)} joint draws of every fitted parameter (Fit.draws): `sessiongen plan",
            "# --seeds N` plans replicate k (k >= 1) with draw k - 1, N at most draws + 1.",
        ]
        for draw in draws:
            lines.append("[[fit.draw]]")
            lines += [f"{k} = {_toml(v)}" for k, v in draw.items()]
    return "\n".join(lines) + "\n"


def _fit_lines(result: Fit) -> list[str]:
    """``[fit]``, ``[fit.interval]`` and, when known, ``[fit.model_error]``."""
    runs = [Path(d).name for d in result.sources]  # run ids: no machine's paths
    command = " ".join(["sessiongen fit", *runs])
    if result.heldout:
        command += " " + " ".join(["--heldout", *(Path(d).name for d in result.heldout)])
    table: dict[str, object] = {
        "fitted": True,
        "date": result.date,
        "runs": runs,
        "hardware": result.hardware,
        "source": command,
        "requests": result.requests,
    }
    lines = ["[fit]", *(f"{k} = {_toml(v)}" for k, v in table.items())]
    lines += ["", "[fit.interval]  # 95%; keys the runs do not identify are absent"]
    lines += [f"{k} = {_toml([lo, hi])}" for k, (lo, hi) in result.intervals().items()]
    error = result.model_error
    if error:
        keys = [
            *(k for k in ("one_in_flight", "loaded") if k in error),
            *(k for k in ("cells_one_in_flight", "cells_loaded") if k in error),
            "source",
        ]
        lines += ["", "[fit.model_error]  # log-scale SD of planned / measured session gain"]
        lines += [f"{k} = {_toml(error[k])}" for k in keys]
    return lines


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    return str(value)


def summary_text(result: Fit) -> str:
    """The fitted values with intervals, then warnings and the residuals, as plain text."""
    lines = [f"fitted on {result.requests} requests that ran alone:"]
    lines += _header_lines(result)
    lines += list(result.warnings) + _residual_lines(result)
    return "\n".join(lines + _loaded_lines(result) + _model_error_lines(result))


def _model_error_lines(result: Fit) -> list[str]:
    error = result.model_error
    if not error:
        return []
    lines = [f"model error (log-scale SD of planned / measured session gain): {error['source']}"]
    for name in ("one_in_flight", "loaded"):
        if name in error:
            lines.append(f"  {name:<24} {error[name]:12.4g}  over {error[f'cells_{name}']} cells")
    return lines


def _loaded_lines(result: Fit) -> list[str]:
    from sessiongen.capacity import loaded

    if result.loaded is None:
        return [
            "loaded terms (itl_per_batch_s, pool_load_mode): not fitted, no run with "
            "sessions in flight together (scenarios/fitprobe-load.toml makes one); the "
            "profile keeps the defaults"
        ]
    return loaded.summary_lines(result.loaded)


def _residual_lines(result: Fit) -> list[str]:
    lines = ["residuals (modeled / measured - 1, median per cell):"]
    for r in result.residuals.iter_rows(named=True):
        lines.append(
            f"  {r['context_tokens']:>8} {r['path']:<6} n={r['n']:<4} measured "
            f"{r['measured_s']:.4g} s, modeled {r['modeled_s']:.4g} s, {r['median_error']:+.1%}"
        )
    return lines


def write_profile(result: Fit, path: Path) -> Path:
    """Write the fitted profile atomically."""
    atomic_write_bytes(path, profile_toml(result).encode())
    return path
