"""What a plan's verdict rests on: the profile and the model's own error.

A verdict is only as good as the profile the planner ran with. :func:`evidence` reads
it from the scenario (``target.sim.profile``) and the profile file's ``[fit]`` tables,
which ``sessiongen fit`` writes:

- ``[fit]``: ``fitted`` (true for a fit to real replicas' records; false for
  ``builtin:study``, calibrated from a paper's table), ``date``, ``runs`` (run ids),
  ``hardware`` and ``source`` (one line each);
- ``[fit.model_error]``: the model's own error, the log-scale standard deviation of
  planned / measured session gain per regime (:data:`REGIMES`), from held-out runs of
  the user's replicas (``sessiongen fit --heldout``).

A scenario with no profile plans with the simulator's defaults, which are
``builtin:study``'s values (``tests/unit/scenario`` holds the two equal), and reads as
that profile. A profile file without a ``[fit]`` table (written by an older
``sessiongen fit``, or by hand) is not known to be fitted and reads as unfitted.

Where the profile carries no model error, the shipped one stands in:
:func:`sessiongen.capacity.modelerror.default_model_error`, the project's own held-out
validation on its CPU pair, said so in :attr:`Evidence.model_error_source`. Nothing
here runs anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessiongen.infra.tomlfile import read_toml
from sessiongen.scenario.spec import BUILTIN, PROFILES_DIR, Scenario

#: The regimes the model's error is told apart by: one session in flight on the pair
#: (closed loop at level 1), and more (the arms' queues and batches interact).
REGIMES = ("one_in_flight", "loaded")
#: The profile a scenario without one plans with (the simulator's defaults).
DEFAULT_PROFILE = "builtin:study"


@dataclass(frozen=True)
class Evidence:
    """The profile behind a plan and the model error its intervals carry."""

    profile: str  # builtin:NAME, or the profile file's name
    fitted: bool
    date: str | None = None
    runs: tuple[str, ...] = ()
    hardware: str | None = None
    source: str | None = None
    model_error: dict[str, float] = field(default_factory=dict)  # regime -> log-scale SD
    model_error_source: str = ""

    def line(self) -> str:
        """One line naming the profile and what it stands on."""
        if not self.fitted:
            what = f"not fitted to your replicas ({self.source})" if self.source else "not fitted"
            return f"profile {self.profile}: {what}"
        parts = [f"fitted {self.date}" if self.date else "fitted"]
        if self.runs:
            parts.append(f"on {len(self.runs)} run{'s' if len(self.runs) > 1 else ''}")
        if self.hardware:
            parts.append(f"({self.hardware})")
        return f"profile {self.profile}: {' '.join(parts)}"


def profile_name(scenario: Scenario) -> str:
    """``builtin:NAME`` for a shipped profile, the file's name for another; the default
    profile's name for a scenario without one."""
    name = scenario.target.sim.profile
    if not name:
        return DEFAULT_PROFILE
    path = Path(name)
    if path.parent.resolve() == PROFILES_DIR.resolve():
        return BUILTIN + path.stem
    return path.name


def _profile_file(scenario: Scenario) -> Path:
    name = scenario.target.sim.profile
    if name:
        return Path(name)
    return PROFILES_DIR / f"{DEFAULT_PROFILE[len(BUILTIN) :]}.toml"


def evidence(scenario: Scenario) -> Evidence:
    """The profile of ``scenario`` and its model error (module doc)."""
    from sessiongen.capacity.modelerror import default_model_error

    loaded = read_toml(_profile_file(scenario))
    fit = loaded.get("fit")
    table: Mapping[str, object] = fit if isinstance(fit, dict) else {}
    told = table.get("model_error")
    errors: Mapping[str, object] = told if isinstance(told, dict) else {}
    sigmas = {r: float(v) for r in REGIMES if isinstance(v := errors.get(r), int | float)}
    if sigmas:
        source = str(errors.get("source") or "the profile's held-out runs")
    else:
        shipped = default_model_error()
        sigmas = {r: float(shipped[r]) for r in REGIMES if r in shipped}
        source = (
            "the project's shipped default (its held-out validation on a CPU pair), not "
            "measured on your replicas: `sessiongen fit --heldout` measures it"
        )
    runs = table.get("runs") or ()
    return Evidence(
        profile=profile_name(scenario),
        fitted=bool(table.get("fitted", False)),
        date=_text(table.get("date")),
        runs=tuple(str(r) for r in runs) if isinstance(runs, list | tuple) else (),
        hardware=_text(table.get("hardware")),
        source=_text(table.get("source")),
        model_error=sigmas,
        model_error_source=source,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
