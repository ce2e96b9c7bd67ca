"""The grid of a what-if plan: the configurations that ``--vary`` options give.

What the options, the configurations and the what-if table's columns are and mean is
:mod:`sessiongen.analysis.whatif`, below both the planner and the report stage.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from sessiongen.analysis.whatif import Config, Vary
from sessiongen.errors import UserError
from sessiongen.scenario.spec import load as load_scenario


def configs(path: str | Path, overrides: Sequence[str], varies: Sequence[Vary]) -> list[Config]:
    """Every configuration of the grid, validated before anything runs (a bad value is a
    one-line error naming the key)."""
    keys = [v.key for v in varies]
    if len(set(keys)) != len(keys):
        raise UserError("--vary: each key once (give all its values in one option)")
    out = []
    for i, combo in enumerate(itertools.product(*(v.values for v in varies))):
        values = dict(zip(keys, combo, strict=True))
        sets = [*overrides, *(f"{k}={v}" for k, v in values.items())]
        out.append(Config(i, values, load_scenario(path, sets)))
    return out
