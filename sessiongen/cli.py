"""The ``sessiongen`` command line: parse flags, call one library function, map errors.

Known errors (:class:`sessiongen.errors.UserError`) print as one line with exit status 2;
a run that finished with failed requests exits 1; anything else keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from . import __version__
from . import scenario as scenario_mod
from .errors import RunFailedError, UserError

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


def load_scenario(path: str, overrides: tuple[str, ...]) -> scenario_mod.Scenario:
    """Load and validate a scenario with overrides (errors are one-line UserErrors)."""
    return scenario_mod.load(Path(path), overrides)


class _UserFacingError(click.ClickException):
    """A :class:`UserError` shown by click as one line."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click's is a class default

    def format_message(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:
        click.echo(f"sessiongen: error: {self.format_message()}", err=True)


class _Group(click.Group):
    """A click group that turns sessiongen's errors into one-line messages and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise _UserFacingError(str(exc), exc.exit_code) from None
        except RunFailedError as exc:
            raise _UserFacingError(str(exc), exc.exit_code) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sessiongen")
def cli() -> None:
    """Measure when a shared KV cache between LLM replicas pays off.

    Build token-exact multi-turn sessions from a scenario, replay them against replicas
    (the embedded simulated pair by default) under each placement with the shared cache
    off and on, and report per-turn speedups with confidence intervals.
    """


@cli.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), required=True, help="JSONL file to write."
)
@click.option("--salt", default="sessiongen", show_default=True, help="Run salt for the markers.")
@set_option
def generate(scenario_file: str, output: str, salt: str, overrides: tuple[str, ...]) -> None:
    """Write every (session, turn) request of SCENARIO_FILE as JSON lines.

    Each line has session_id, turn, context_tokens, content_tokens, expected and body
    (the exact request body replay sends). Frozen and no-history modes only: live
    history depends on the server's answers.
    """
    from .generate import write_jsonl

    sc = load_scenario(scenario_file, overrides)
    stats = write_jsonl(sc, salt, Path(output))
    click.echo(
        f"wrote {stats['requests']} requests ({stats['sessions']} sessions, "
        f"{stats['content_tokens']:,} content tokens) to {output}"
    )


@cli.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "--endpoints",
    metavar="URL,URL,...",
    help="Existing OpenAI-compatible replicas (default: the embedded simulated pair).",
)
@click.option(
    "--cache",
    type=click.Choice(["on", "off"]),
    help="Which shared-cache arm the given endpoints are in.",
)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False),
    default="runs",
    show_default=True,
    help="Where run folders go.",
)
@click.option("--report/--no-report", default=True, show_default=True, help="Write the report.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@set_option
def replay(
    scenario_file: str,
    endpoints: str | None,
    cache: str | None,
    runs_dir: str,
    report: bool,
    progress: bool,
    overrides: tuple[str, ...],
) -> None:
    """Replay SCENARIO_FILE under each placement with the shared cache off and on.

    Without --endpoints the embedded simulated replica pair is used (a calibrated
    model of vLLM + LMCache; its results say SIMULATED). Writes runs/<run-id>/ with
    manifest.json, requests.parquet, metrics.parquet and, by default, a report.
    Exit status 1 when any request failed, 130 when interrupted.
    """
    from . import replay as replay_mod

    sc = load_scenario(scenario_file, overrides)
    opts = replay_mod.ReplayOptions(
        runs_dir=Path(runs_dir),
        endpoints=[u.strip() for u in endpoints.split(",") if u.strip()] if endpoints else None,
        cache=cache,
        progress=progress,
    )
    outcome = replay_mod.replay(sc, opts)
    click.echo(f"run: {outcome.run_dir}")
    if outcome.requests and not outcome.interrupted:
        _summarize(outcome.run_dir, report)
    if outcome.interrupted:
        click.echo(f"interrupted: kept {outcome.requests} measured requests", err=True)
        raise SystemExit(130)
    if outcome.failed:
        raise RunFailedError(outcome.failure_summary())


def _summarize(run_dir: Path, report: bool) -> None:
    """Print the per-turn table and write the report, when analysis is available."""
    try:
        from . import analysis
        from . import report as report_mod
    except ImportError:  # analysis not built yet in this checkout
        return
    click.echo(analysis.console_table(analysis.load_run(run_dir)))
    if report:
        click.echo(f"report: {report_mod.write_report(run_dir)}")


def main(argv: list[str] | None = None) -> None:
    """Entry point for the console script and ``python -m sessiongen``."""
    cli.main(args=argv, prog_name="sessiongen")
