"""The ``sessiongen`` command line: parse flags, call one library function, map errors.

Known errors (:class:`sessiongen.errors.UserError`) print as one line with exit status 2;
a run that finished with failed requests or cache failures (ON answers wrong where OFF
answered the same prompt right) exits 1; anything else keeps its traceback. SIGTERM and
SIGHUP stop a command as Ctrl-C does, and a second signal only hurries the clean-up
(:mod:`sessiongen.infra.signals`); an interrupted command exits 128 plus the signal's
number (130, 143, 129).

This file is the table of contents: one module per command, each listed below, and
:mod:`.common` for what they share (``--set``, scenario loading, the error mapping).
Each command imports the library it calls inside its function: the replay, analysis
and report stacks (aiohttp, polars, matplotlib) take 1 to 2 s to import, which
``sessiongen --help`` and every one-line error should not pay.
"""

from __future__ import annotations

import atexit
import functools
import gc
import sys

import click

from sessiongen._version import __version__
from sessiongen.cli import (
    calibrate,
    compare,
    export,
    fit,
    generate,
    merge,
    nightly,
    notebook,
    pair,
    plan,
    replay,
    report,
    sim,
    traceinfo,
    trend,
)
from sessiongen.cli.common import Group
from sessiongen.infra import signals

#: Every command, by the module that holds it (``--help`` lists them by name).
COMMANDS: tuple[click.Command, ...] = (
    generate.generate,  # a scenario's requests as JSON lines
    export.export,  # ... as a trace other tools replay
    traceinfo.trace_info,  # what a trace implies
    replay.replay,  # the replay of both cache arms, its outcome
    report.report,  # a run's report
    merge.merge,  # runs of one design's arms as one run
    notebook.notebook,  # the analysis notebook on a run
    compare.compare,  # a run against a baseline
    sim.sim,  # the embedded simulated replicas
    pair.pair,  # real replicas that outlive the command
    trend.trend,  # the trend store
    nightly.nightly,  # the nightly suite
    fit.fit_cmd,  # the simulator fitted to real runs
    plan.plan_cmd,  # what-ifs on the virtual clock
    calibrate.calibrate_cmd,  # the client's own overhead
)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sessiongen")
def cli() -> None:
    """Measure when a shared KV cache between LLM replicas pays off.

    Build token-exact multi-turn sessions from a scenario, replay them against replicas
    (the embedded simulated pair by default) under each placement with the shared cache
    off and on, and report per-turn speedups with confidence intervals.
    """


for _command in COMMANDS:
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point for the console script and ``python -m sessiongen``.

    Usage errors (a missing argument, a path that is a file where a folder is wanted)
    print as one line naming the option, like every other user error, exit status 2.
    """
    _freeze_heap_at_exit()
    try:
        signals.install()  # for the whole process: its exit hooks stop what is left
        try:
            cli.main(args=argv, prog_name="sessiongen", standalone_mode=False)
        except click.UsageError as exc:
            where = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            click.echo(f"sessiongen: error: {exc.format_message()}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("interrupted", err=True)
            sys.exit(signals.exit_status())
    except KeyboardInterrupt:
        # an interrupt outside click's reach (inside install(), or a deferred one raised
        # while the first was being reported) still exits 128 + the signal, never by
        # the interpreter's death from SIGINT
        sys.exit(signals.exit_status())


@functools.cache  # once a process, however often main() runs
def _freeze_heap_at_exit() -> None:
    """At exit the interpreter's last collection walks every object a command made (a
    planned trace's: 0.1 s of a 1.5 s plan) only to free them all; frozen, it skips
    them. Registered before any other exit hook of a command, it runs after them all."""
    atexit.register(gc.freeze)
