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
    """A :class:`UserError` shown by click as one line, with its exit status."""

    exit_code = UserError.exit_code

    def format_message(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:
        click.echo(f"sessiongen: error: {self.format_message()}", err=True)


class FailedRunMessage(UserFacingError):
    """A :class:`RunFailedError` shown by click as one line, with its exit status."""

    exit_code = RunFailedError.exit_code


class Group(click.Group):
    """A click group that turns sessiongen's errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise UserFacingError(str(exc)) from None
        except RunFailedError as exc:
            raise FailedRunMessage(str(exc)) from None


STORE_OPTION = click.option(
    "--store",
    type=click.Path(file_okay=False),
    required=True,
    help="Trend store folder (one Parquet file per run, per scenario).",
)
#: ``--salt``: the run salt a scenario's markers are made with (generate, export).
SALT_OPTION = click.option(
    "--salt", default="sessiongen", show_default=True, help="Run salt for the markers."
)
#: ``--server URL``: the replica that counts tokens for ``model.tokenizer = "server"``.
SERVER_OPTION = click.option(
    "--server",
    metavar="URL",
    help='Replica whose /tokenize counts tokens (for model.tokenizer = "server").',
)
#: ``--block-tokens``: tokens per hash id of a Mooncake-style trace (export, trace-info).
BLOCK_TOKENS_OPTION = click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Tokens per hash id.",
)

#: ``--pays-at``'s default: :data:`sessiongen.analysis.payoff.DEFAULT_PAYS_AT`, written here
#: so that the CLI's start-up imports no analysis (a test keeps the two equal).
PAYS_AT = 1.1


def pays_at_option(help: str) -> Callable[[F], F]:
    """``--pays-at``: the session gain the pool must reach (replay and plan)."""
    return click.option(
        "--pays-at",
        type=click.FloatRange(min=0, min_open=True),
        default=PAYS_AT,
        show_default=True,
        help=help,
    )
