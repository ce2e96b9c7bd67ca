"""``sessiongen sim``: the embedded simulated replicas (commands of :mod:`sessiongen.sim.cli`)."""

from __future__ import annotations

import click

from sessiongen.sim.cli import serve_command, switch_command


@click.group("sim")
def sim() -> None:
    """The embedded simulated replicas (a calibrated model of vLLM + LMCache)."""


sim.add_command(serve_command)
sim.add_command(switch_command)
