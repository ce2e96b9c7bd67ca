"""What the commands share: ``--set``, ``--allow-arm-mismatch``, ``--store``, scenario
loading, and the one place sessiongen's errors become one-line messages and exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from sessiongen import scenario as scenario_mod
from sessiongen.errors import RunFailedError, UserError

F = TypeVar("F", bound=Callable[..., Any])


def set_option(func: F) -> F:
    """``--set dotted.key=value``, repeatable, applied to the scenario before validation."""
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a scenario field, e.g. --set sessions.count=8 (repeatable).",
    )(func)


def allow_arm_mismatch_option(func: F) -> F:
    """``--allow-arm-mismatch``: ``target.allow_arm_mismatch = true``, added to the
    command's ``--set`` overrides (so the run's scenario records it)."""

    @functools.wraps(func)
    def wrapper(*args: Any, allow_arm_mismatch: bool, **kwargs: Any) -> Any:
        if allow_arm_mismatch:
            kwargs["overrides"] = (*kwargs["overrides"], "target.allow_arm_mismatch=true")
        return func(*args, **kwargs)

    return click.option(
        "--allow-arm-mismatch",
        is_flag=True,
        help="Send a block even when its replicas say at start they are in the other cache "
        "arm (by default the replay stops before that block, exit status 2).",
    )(cast(F, wrapper))


def load_scenario(path: str, overrides: tuple[str, ...]) -> scenario_mod.Scenario:
    """Load and validate a scenario with overrides (errors are one-line UserErrors)."""
    return scenario_mod.load(Path(path), overrides)


class UserFacingError(click.ClickException):
    """A :class:`UserError` shown by click as one line."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click's is a class default

    def format_message(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:
        click.echo(f"sessiongen: error: {self.format_message()}", err=True)


class Group(click.Group):
    """A click group that turns sessiongen's errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise UserFacingError(str(exc), exc.exit_code) from None
        except RunFailedError as exc:
            raise UserFacingError(str(exc), exc.exit_code) from None


STORE_OPTION = click.option(
    "--store",
    type=click.Path(file_okay=False),
    required=True,
    help="Trend store folder (one Parquet file per run, per scenario).",
)
