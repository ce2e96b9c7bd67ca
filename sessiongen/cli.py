"""The ``sessiongen`` command line: parse flags, call one library function, map errors.

Known errors (:class:`sessiongen.errors.UserError`) print as one line with exit status 2;
a run that finished with failed requests or cache failures (ON answers wrong where OFF
answered the same prompt right) exits 1; anything else keeps its traceback. SIGTERM and
SIGHUP stop a command as Ctrl-C does, and a second signal only hurries the clean-up
(:mod:`sessiongen.infra.signals`); an interrupted command exits 128 plus the signal's
number (130, 143, 129).

Each command imports the library it calls inside its function: the replay, analysis
and report stacks (aiohttp, polars, matplotlib) take 1 to 2 s to import, which
``sessiongen --help`` and every one-line error should not pay.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from sessiongen import __version__
from sessiongen import scenario as scenario_mod
from sessiongen.errors import CacheFailureError, RunDirError, RunFailedError, UserError
from sessiongen.infra import signals
from sessiongen.scenario.schema import check_field
from sessiongen.sim.cli import serve_command, switch_command

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
@click.option(
    "--server",
    metavar="URL",
    help='Replica whose /tokenize counts tokens (for model.tokenizer = "server").',
)
@set_option
def generate(
    scenario_file: str, output: str, salt: str, server: str | None, overrides: tuple[str, ...]
) -> None:
    """Write every (session, turn) request of SCENARIO_FILE as JSON lines.

    Each line has session_id, turn, context_tokens, content_tokens, expected and body
    (the exact request body replay sends). Frozen and no-history modes only: live
    history depends on the server's answers.
    """
    from sessiongen.workload.generate import write_jsonl

    sc = load_scenario(scenario_file, overrides)
    stats = write_jsonl(sc, salt, Path(output), server_url=server)
    click.echo(
        f"wrote {stats['requests']} requests ({stats['sessions']} sessions, "
        f"{stats['content_tokens']:,} content tokens) to {output}"
    )


@cli.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), required=True, help="Trace file to write."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["mooncake"]),
    default="mooncake",
    show_default=True,
    help="Trace format (Mooncake-style JSONL: timestamp/delay, lengths, hash_ids).",
)
@click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Tokens per hash id.",
)
@click.option("--salt", default="sessiongen", show_default=True, help="Run salt for the markers.")
@click.option(
    "--server",
    metavar="URL",
    help='Replica whose /tokenize counts tokens (for model.tokenizer = "server").',
)
@set_option
def export(
    scenario_file: str,
    output: str,
    fmt: str,
    block_tokens: int,
    salt: str,
    server: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Write SCENARIO_FILE's requests as a trace other tools can replay.

    One line per (session, turn): session_id (multi-turn scenarios), timestamp (ms) on a
    session's first turn and delay (ms, the think time) on later ones, input_length,
    output_length and hash_ids of the real token ids, chained so equal ids mean equal
    prefixes. Frozen and no-history modes only.
    """
    from sessiongen.workload.export import write_mooncake

    sc = load_scenario(scenario_file, overrides)
    stats = write_mooncake(sc, salt, Path(output), block_tokens=block_tokens, server_url=server)
    click.echo(
        f"wrote {stats['requests']} requests ({stats['sessions']} sessions, "
        f"{stats['input_tokens']:,} input tokens, {stats['blocks']:,} distinct blocks) "
        f"as a {fmt} trace to {output}"
    )


@cli.command("trace-info")
@click.argument("trace_file", type=click.Path(dir_okay=False))
@click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Tokens per hash id.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Read at most this many requests.")
@click.option(
    "--speedup",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Divide arrivals and delays by this, as sessions.trace.speedup does in a replay "
    "(the last arrival printed is the replay's).",
)
def trace_info(trace_file: str, block_tokens: int, limit: int | None, speedup: float) -> None:
    """Check a Mooncake-style JSONL trace line by line and say what it implies.

    Prints its requests, sessions, span, token counts, the longest prompt, and the share
    of prompt tokens an infinite prefix cache would have served (leading blocks whose
    hash id an earlier request had). A bad line is one error naming the line and field.
    """
    from sessiongen.workload.trace import read_trace
    from sessiongen.workload.tracestats import summarize

    stream = read_trace(trace_file, block_tokens=block_tokens, limit=limit, speedup=speedup)
    s = summarize(stream, block_tokens)
    single = f" ({s.single_requests:,} of one request: no session_id)" if s.single_requests else ""
    click.echo(
        f"{trace_file}: {s.requests:,} requests, {s.sessions:,} sessions{single}, "
        f"last arrival at {s.span_ms / 1000:,.1f} s\n"
        f"input tokens {s.input_tokens:,} (longest {s.longest_input:,}, line "
        f"{s.longest_line}), output tokens {s.output_tokens:,}\n"
        f"{s.distinct_blocks:,} distinct blocks of {block_tokens}; an infinite prefix cache "
        f"serves {s.reusable_share:.1%} of input tokens"
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
    help="Which shared-cache arm the given endpoints are in (one arm per run; combine "
    "runs of both arms with sessiongen report RUN_OFF RUN_ON).",
)
@click.option(
    "--endpoints-off",
    metavar="URL,URL,...",
    help="A pair without the KV connector: the OFF arm's blocks go there (with --endpoints-on).",
)
@click.option(
    "--endpoints-on",
    metavar="URL,URL,...",
    help="A pair with the KV connector: the ON arm's blocks go there (with --endpoints-off).",
)
@click.option(
    "--switch-command",
    metavar="'CMD {arm}'",
    help="Run before every block with {arm} = on or off to switch the --endpoints' arm; "
    "each block waits until they are healthy and report it.",
)
@click.option(
    "--strict-arms",
    is_flag=True,
    help="Exit 1 when a block's counters contradict its arm (ON without external hits on "
    "cross-replica requests, OFF with any).",
)
@click.option("--dry-run", is_flag=True, help="Print the blocks and what opens each; run nothing.")
@click.option(
    "--gateway",
    metavar="URL",
    help="An existing router in front of the replicas: every turn goes there with the "
    "session id in --session-header (placement 'gateway', unless --set placement.policies).",
)
@click.option(
    "--session-header",
    metavar="NAME",
    help="Request header carrying the session id on routed turns [default: X-Session-ID].",
)
@click.option(
    "--replica-header",
    metavar="NAME",
    help="Response header that names the replica that served a turn (behind a gateway).",
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
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Processes that run each block's sessions (for many hundreds of streams).",
)
@click.option(
    "--calibrate",
    "calibrate_first",
    is_flag=True,
    help="Measure the client's own overhead at this load first; kept in the manifest.",
)
@click.option(
    "--pays-at",
    type=click.FloatRange(min=0, min_open=True),
    default=1.1,
    show_default=True,
    help="The session gain (OFF / ON) the pool must reach, as for plan: its 95% interval "
    "wholly at or above it pays, wholly below does not pay, straddling it is undecided.",
)
@allow_arm_mismatch_option
@set_option
def replay(
    scenario_file: str,
    endpoints: str | None,
    cache: str | None,
    endpoints_off: str | None,
    endpoints_on: str | None,
    switch_command: str | None,
    strict_arms: bool,
    dry_run: bool,
    gateway: str | None,
    session_header: str | None,
    replica_header: str | None,
    runs_dir: str,
    report: bool,
    progress: bool,
    workers: int,
    calibrate_first: bool,
    pays_at: float,
    overrides: tuple[str, ...],
) -> None:
    """Replay SCENARIO_FILE under each placement with the shared cache off and on.

    Without --endpoints the embedded simulated replica pair is used (a calibrated
    model of vLLM + LMCache; its results say SIMULATED). Writes runs/<run-id>/ with
    manifest.json, requests.parquet, metrics.parquet and, by default, a report.
    The console and the report open with the decision sessiongen plan gives: per
    placement the session gain with its interval, the later-turn gain, and whether the
    pool pays at --pays-at. Exit status 1 when any request failed or the cache changed
    answers (an ON answer wrong where the OFF arm answered the same prompt right), 130
    when interrupted (143 on SIGTERM, 129 on SIGHUP); what was measured before is kept.

    With --gateway, turns go to your router and the replica that served each is found
    from the response (--replica-header, or vLLM's system_fingerprint) or, at
    concurrency 1, from the --endpoints' counters; otherwise it is recorded as unknown.

    Both arms on your own replicas: two pairs (--endpoints-off A,B --endpoints-on C,D),
    or one pair your command switches (--endpoints A,B --switch-command 'CMD {arm}').
    Every block's arm is checked against its counters; a contradiction is a warning
    and a Problem in the report, and exit status 1 with --strict-arms.
    """
    from sessiongen import replay as replay_mod

    overrides += _router_overrides(gateway, session_header, replica_header, overrides)
    overrides += _arm_overrides(endpoints_off, endpoints_on, switch_command, strict_arms)
    sc = load_scenario(scenario_file, overrides)
    opts = replay_mod.ReplayOptions(
        runs_dir=Path(runs_dir),
        endpoints=_endpoint_urls(endpoints),
        cache=cache,
        progress=progress,
        calibrate=calibrate_first,
        workers=workers,
    )
    if dry_run:
        for line in replay_mod.dry_run(sc, opts):
            click.echo(line)
        return
    outcome = replay_mod.replay(sc, opts)
    click.echo(f"run: {outcome.run_dir}")
    wrong = mislabeled = None
    if outcome.requests and not outcome.interrupted:
        _summarize(outcome.run_dir, report, pays_at=pays_at)
        wrong = _correctness(outcome.run_dir)
        mislabeled = _arm_check(outcome.run_dir)
    if outcome.interrupted:
        click.echo(f"interrupted: kept {outcome.requests} measured requests", err=True)
        raise SystemExit(signals.exit_status())
    strict = mislabeled if sc.target.strict_arms else None
    if outcome.failed:
        raise RunFailedError("; ".join(filter(None, [outcome.failure_summary(), wrong, strict])))
    if wrong:
        raise CacheFailureError("; ".join(filter(None, [wrong, strict])))
    if strict:
        raise RunFailedError(strict)


def _arm_overrides(
    endpoints_off: str | None,
    endpoints_on: str | None,
    switch_command: str | None,
    strict_arms: bool,
) -> tuple[str, ...]:
    """The scenario overrides the arm flags stand for (URL lists validated like a file's)."""
    out: list[str] = []
    for flag, key, text in (
        ("--endpoints-off", "endpoints_off", endpoints_off),
        ("--endpoints-on", "endpoints_on", endpoints_on),
    ):
        urls = _url_list(text, flag, key)
        if urls is not None:
            out.append(f"target.{key}={json.dumps(urls)}")
    if switch_command is not None:
        check_field(
            scenario_mod.TargetSpec, "switch_command", switch_command, "--switch-command", "target"
        )
        out.append(f"target.switch_command={json.dumps(switch_command)}")
    if strict_arms:
        out.append("target.strict_arms=true")
    return tuple(out)


def _arm_check(run_dir: Path) -> str | None:
    """Print a warning per block whose counters contradict its arm; one line for them."""
    from sessiongen import analysis

    lines = analysis.mislabeled_arms(analysis.load_run(run_dir))
    for line in lines:
        click.echo(f"warning: mislabeled arm: {line}", err=True)
    if not lines:
        return None
    return f"mislabeled arms: {len(lines)} blocks contradict their cache arm; see {run_dir}"


def _endpoint_urls(endpoints: str | None) -> list[str] | None:
    """``--endpoints URL,URL``: validated like ``target.endpoints`` in a file, not empty."""
    return _url_list(endpoints, "--endpoints", "endpoints")


def _url_list(text: str | None, flag: str, key: str) -> list[str] | None:
    """``FLAG URL,URL``: validated like ``target.KEY`` in a file, not empty."""
    if text is None:
        return None
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise click.BadParameter(f"expected URL,URL,..., got {text!r}", param_hint=flag)
    return list(check_field(scenario_mod.TargetSpec, key, urls, flag, "target"))


def _correctness(run_dir: Path) -> str | None:
    """Print the run's correctness verdicts; the cache failures as one line, if any."""
    from sessiongen import analysis

    run = analysis.load_run(run_dir)
    fault = run.meta.fault_line()
    if fault:
        click.echo(fault)
    verdicts = analysis.correctness(run)
    line = verdicts.verdict_line()
    if line:
        click.echo(line)
    failure = verdicts.failure_line()
    return f"{failure}; see {run_dir}" if failure else None


def _router_overrides(
    gateway: str | None,
    session_header: str | None,
    replica_header: str | None,
    overrides: tuple[str, ...],
) -> tuple[str, ...]:
    """The scenario overrides the router flags stand for."""
    out: list[str] = []
    if gateway:
        out.append(f"target.gateway={gateway}")
        if not any(o.strip().startswith("placement.policies") for o in overrides):
            out.append('placement.policies=["gateway"]')
    if session_header:
        out.append(f"target.router.session_header={session_header}")
    if replica_header:
        out.append(f"target.replica_header={replica_header}")
    return tuple(out)


def _summarize(run_dir: Path, report: bool, *, pays_at: float) -> None:
    """Print the decision (as plan gives it, at ``pays_at``), then the per-turn table and
    what limits it (too few sessions, drift unchecked), then write the report."""
    from sessiongen import analysis
    from sessiongen import report as report_mod
    from sessiongen.report.decision import console_text, decide

    whole = analysis.load_run(run_dir)
    run = whole.levels_apart()
    decision = decide(whole, pays_at)
    click.echo(console_text(decision, run.target_label))
    for line in analysis.trust_warnings(run):
        click.echo(line, err=True)
    click.echo(analysis.console_table(run))
    routers = analysis.console_routing(run)
    if routers is not None:
        click.echo(routers)
    for warning in analysis.interval_warnings(run):
        click.echo(f"warning: {warning}")
    if report:
        path = report_mod.write_report(run_dir, pays_at=pays_at, decision=decision)
        click.echo(f"report: {path}")


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
def report(run_dirs: tuple[str, ...]) -> None:
    """Write RUN_DIR/report/: report.md, report.html, summary.csv and plots (PNG, SVG).

    Several run folders (RUN_OFF RUN_ON: runs of one scenario, seed and target, each of
    its own arms) are merged first into a new run folder beside the first (see merge),
    and the report is that run's.
    """
    from sessiongen import report as report_mod

    run_dir = Path(run_dirs[0])
    if len(run_dirs) > 1:
        from sessiongen.records.merge import merge_runs

        run_dir = merge_runs([Path(d) for d in run_dirs])
        click.echo(f"merged: {run_dir}")
    click.echo(f"report: {report_mod.write_report(run_dir)}")


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False),
    help="The new run folder [default: a new run id beside the first run].",
)
def merge(run_dirs: tuple[str, ...], output: str | None) -> None:
    """Combine runs of one design's different arms (RUN_OFF RUN_ON) into one run folder.

    The runs must share scenario, seed and target (a single-arm run per arm, e.g.
    replay --endpoints A,B --cache off, then --cache on); each run's blocks take their
    places in the design, so the merged run reads as one run of both arms.
    """
    from sessiongen.records.merge import merge_runs

    click.echo(f"merged: {merge_runs([Path(d) for d in run_dirs], output)}")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="The executed notebook: OUT.html (one page) or OUT.ipynb "
    "[default: RUN_DIR/report/analysis.html].",
)
def notebook(run_dir: str, output: str | None) -> None:
    """Execute the analysis notebook on RUN_DIR and write the executed copy.

    Runs notebooks/analysis.ipynb top to bottom in a fresh kernel on RUN_DIR (the
    repository's copy is never written): the report's Problems and Limits first, the
    headline speedups, the details, and a cell to slice your own way. Exit status 1
    when a cell fails (the output is written, the error in it).
    """
    from sessiongen.report.notebook import run_notebook

    click.echo(f"notebook: {run_notebook(Path(run_dir), output)}")


@cli.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=0.05,
    show_default=True,
    help="Margin of 'no change': ratios within 1 +- threshold are the same (0.05 = 5%).",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    help="Level of each test; the intervals are 1 - 2 alpha (90% by default, as in TOST).",
)
@click.option(
    "--failure-margin",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.02,
    show_default=True,
    help="Largest rise in the share of failed requests per cell that is still the same.",
)
@click.option(
    "--run-noise",
    type=click.FloatRange(min=0),
    default=None,
    help="Run-to-run SD of a cell's log median (0.04 = 4%), e.g. from A/A runs "
    "[default: estimated from several runs a side, else from --store, else 4% assumed].",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False),
    default=None,
    help="A trend store whose night-to-night noise for this scenario is the run-to-run noise.",
)
@click.option(
    "--force", is_flag=True, help="Compare runs of different scenarios or time scales anyway."
)
def compare(
    run_a: str,
    run_b: str,
    threshold: float,
    alpha: float,
    failure_margin: float,
    run_noise: float | None,
    store: str | None,
    force: bool,
) -> None:
    """Compare RUN_B against baseline RUN_A per arm, context size and turn.

    RUN_A and RUN_B are run folders, or several of one side joined by commas
    (runs/a1,runs/a2,runs/a3): the spread between a side's runs then measures the
    run-to-run noise. Each cell's ratio median TTFT B / A (failed requests count as
    slower than any) gets an interval from a paired bootstrap over sessions plus the
    run-to-run noise; a cell is SLOWER when B/A is surely above 1 + threshold or B
    surely fails more, after a Holm correction over cells; faster when surely below
    1 - threshold; no change when surely within 1 +- threshold (an equivalence test);
    else inconclusive, and always below 5 sessions.

    Exit status: 0 no change or faster, 1 some cell slower, 3 inconclusive (the runs
    cannot tell: add sessions or runs, or widen --threshold), 2 usage errors, including
    runs of different scenarios or time scales without --force.
    """
    from sessiongen import analysis

    side_a = [analysis.load_run(Path(p)).levels_apart() for p in _run_list(run_a)]
    side_b = [analysis.load_run(Path(p)).levels_apart() for p in _run_list(run_b)]
    noise = None
    if run_noise is not None:
        noise = analysis.RunNoise(run_noise, "given with --run-noise")
    elif store is not None and len(side_a) == len(side_b) == 1:
        from sessiongen.trend import store_run_noise

        noise = store_run_noise(Path(store), side_a[0])
    elif store is not None:
        click.echo("note: --store not read: several runs a side measure the noise themselves")
    result = analysis.compare_runs(
        side_a,
        side_b,
        threshold=threshold,
        alpha=alpha,
        failure_margin=failure_margin,
        force=force,
        run_noise=noise,
    )
    click.echo(result.to_text())
    if result.exit_code:
        raise SystemExit(result.exit_code)


def _run_list(text: str) -> list[str]:
    """RUN or RUN,RUN,...: the run folders of one side of a comparison."""
    parts = [p for p in text.split(",") if p]
    if not parts:
        raise RunDirError(f"{text!r}: expected a run folder or folders joined by commas")
    for part in parts:
        if Path(part).is_file():
            raise RunDirError(f"{part}: is a file, not a run folder")
    return parts


@cli.group()
def sim() -> None:
    """The embedded simulated replicas (a calibrated model of vLLM + LMCache)."""


sim.add_command(serve_command)
sim.add_command(switch_command)


@cli.group()
def pair() -> None:
    """Real replicas (vLLM + one LMCache server) that outlive the command.

    Needs the real stack: scripts/install-real-stack.sh installs the CPU build.
    """


STATE_DIR_OPTION = click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    default="runs/pair",
    show_default=True,
    help="Where the pair's state file and logs live.",
)


@pair.command("up")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--cache", type=click.Choice(["on", "off"]), default="on", show_default=True)
@STATE_DIR_OPTION
@set_option
def pair_up(scenario_file: str, cache: str, state_dir: str, overrides: tuple[str, ...]) -> None:
    """Start the managed pair of SCENARIO_FILE ([target.managed]) and leave it running."""
    from sessiongen.launch.state import pair_up as up
    from sessiongen.launch.state import records

    sc = load_scenario(scenario_file, overrides)
    state = up(sc, Path(state_dir), cache_on=cache == "on")
    for rec in records(state):
        click.echo(f"{rec.name}: pid {rec.pid} {rec.url}".rstrip())
    click.echo(f"state: {Path(state_dir) / 'pair.json'}  (stop with: sessiongen pair down)")


@pair.command("down")
@STATE_DIR_OPTION
def pair_down(state_dir: str) -> None:
    """Stop the pair recorded in --state-dir (every process group, no orphans)."""
    from sessiongen.launch.state import pair_down as down

    lines = down(Path(state_dir))
    for line in lines or ["no pair recorded"]:
        click.echo(line)


@pair.command("status")
@STATE_DIR_OPTION
def pair_status(state_dir: str) -> None:
    """Show each recorded process: alive, healthy, port, log."""
    from sessiongen.launch.state import pair_status as status

    rows = status(Path(state_dir))
    if not rows:
        click.echo("no pair recorded")
    for row in rows:
        health = "healthy" if row.get("healthy") else "not healthy"
        alive = "alive" if row.get("alive") else "gone"
        click.echo(
            f"{row.get('name')}: {alive}, {health}, {row.get('url') or ''} log {row.get('log')}"
        )


@cli.group()
def trend() -> None:
    """The performance trend store: add runs, detect regressions, plot the history."""


STORE_OPTION = click.option(
    "--store",
    type=click.Path(file_okay=False),
    required=True,
    help="Trend store folder (one Parquet file per run, per scenario).",
)
WINDOW_OPTION = click.option(
    "--window", type=int, default=90, show_default=True, help="Newest nights to analyse."
)


@trend.command("add")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@STORE_OPTION
def trend_add(run_dirs: tuple[str, ...], store: str) -> None:
    """Add the summaries of RUN_DIRS to the store (adding a run twice changes nothing)."""
    from sessiongen import trend as trend_mod

    added = trend_mod.trend_add([Path(d) for d in run_dirs], Path(store))
    click.echo(f"added {len(added)} of {len(run_dirs)} runs to {store}")


def _metric_thresholds(items: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"expected METRIC=FRACTION, got {item!r}") from None
        if not sep:
            raise click.BadParameter(f"expected METRIC=FRACTION, got {item!r}")
    return out


@trend.command("check")
@STORE_OPTION
@click.option("--threshold", type=float, default=0.05, show_default=True)
@click.option("--min-nights", type=int, default=2, show_default=True)
@click.option(
    "--metric-threshold",
    multiple=True,
    metavar="METRIC=FRACTION",
    help="Per-metric threshold, e.g. ttft=0.08 or speedup=0.1 (repeatable).",
)
@WINDOW_OPTION
def trend_check(
    store: str, threshold: float, min_nights: int, metric_threshold: tuple[str, ...], window: int
) -> None:
    """Find level shifts per series; exit 1 when any regression is found.

    A regression is a shift to a worse level by more than the threshold that has
    lasted at least --min-nights nights; correctness divergences and contamination
    count at any size.
    """
    from sessiongen import trend as trend_mod

    result = trend_mod.trend_check(
        Path(store),
        threshold=threshold,
        min_nights=min_nights,
        per_metric_thresholds=_metric_thresholds(metric_threshold),
        window=window,
    )
    click.echo(result.table())
    if result.exit_code:
        raise SystemExit(result.exit_code)


@trend.command("plot")
@STORE_OPTION
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Folder for PNGs.")
@WINDOW_OPTION
def trend_plot(store: str, out: str, window: int) -> None:
    """One PNG per headline series with its detected levels and shifts."""
    from sessiongen import trend as trend_mod

    for path in trend_mod.trend_plot(Path(store), Path(out), window=window):
        click.echo(str(path))


@cli.command()
@click.argument("config", type=click.Path(dir_okay=False))
@STORE_OPTION
@click.option(
    "--runs-dir", type=click.Path(file_okay=False), default="runs/nightly", show_default=True
)
@click.option(
    "--progress/--no-progress",
    default=False,
    show_default=True,
    help="Each block's progress line too (a line per scenario as it starts and ends is "
    "always printed, on stderr).",
)
def nightly(config: str, store: str, runs_dir: str, progress: bool) -> None:
    """Run the suite in CONFIG, report each run, add to the store, check and plot.

    Exit 1 on a regression or a failed run, 0 otherwise. See nightly/example.toml.
    """
    from sessiongen.trend.nightly import run_nightly

    def say(line: str) -> None:
        click.echo(line, err=True)

    result = run_nightly(Path(config), Path(store), Path(runs_dir), progress=progress, say=say)
    click.echo(f"summary: {result.summary}")
    if result.check is not None:
        click.echo(result.check.table())
    if result.exit_code:
        raise SystemExit(signals.exit_status() if result.interrupted else result.exit_code)


@cli.command("fit")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), required=True, help="Profile TOML to write."
)
@click.option(
    "--kv-bytes-per-token",
    type=click.IntRange(1),
    help="The model's KV bytes per token (default: from the runs, where they say it).",
)
@click.option(
    "--resamples",
    type=click.IntRange(1000),
    help="Bootstrap resamples behind each interval (at least 1000; default 2000).",
)
@click.option(
    "--heldout",
    "heldout",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A replay (both cache arms) not given to the fit, planned with the fitted profile "
    "to measure the model's own error per regime ([fit.model_error]); repeat for more.",
)
def fit_cmd(
    run_dirs: tuple[str, ...],
    output: str,
    kv_bytes_per_token: int | None,
    resamples: int | None,
    heldout: tuple[str, ...],
) -> None:
    """Fit the simulator's timing profile to real runs of RUN_DIRS.

    Uses the requests that ran alone (concurrency 1, exact hit counts): cold prefills
    at several sizes, local hits and cross-replica pool hits, as the probe scenario
    (scenarios/fitprobe.toml) makes them. Prints each parameter with a 95% bootstrap
    interval over sessions (and over runs, when several are given), or says that the
    runs do not identify it, then the design's rank, warnings and the residuals per
    cell; writes a profile that --set target.sim.profile=OUTPUT loads.

    Runs with sessions in flight together (scenarios/fitprobe-load.toml) give the loaded
    terms: decode batching and whether pool loads hold the engine step, chosen by
    planning those runs under each candidate; it says which the runs identify.

    With --heldout RUN (replays of both cache arms that the fit does not see), each is
    planned with the fitted profile and its planned session gains are compared with the
    measured ones: the model's own error per regime (one session in flight, loaded) is
    written into the profile for the planner's intervals.
    """
    from sessiongen.capacity import fit

    result = fit.fit_runs(
        [Path(d) for d in run_dirs],
        kv_bytes_per_token=kv_bytes_per_token,
        resamples=resamples or fit.RESAMPLES,
        progress=True,
        heldout=[Path(d) for d in heldout],
    )
    click.echo(fit.summary_text(result))
    click.echo(f"profile: {fit.write_profile(result, Path(output))}")


@cli.command("plan")
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option(
    "--vary",
    "varies",
    multiple=True,
    metavar="KEY=V1,V2",
    help="A scenario or profile key and its values, e.g. --vary target.sim.replicas=2,4 "
    "(repeatable: every combination runs).",
)
@click.option(
    "--profile",
    type=click.Path(dir_okay=False),
    help="A profile file (sessiongen fit writes one): --set target.sim.profile=PROFILE.",
)
@click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--tokens",
    type=click.Choice(["auto", "exact", "shape"]),
    default="auto",
    show_default=True,
    help="Prompts tokenized exactly, or synthetic keys of the same shape (large runs).",
)
@click.option(
    "--jobs",
    type=click.IntRange(1),
    help="Configurations planned at once, each in its own process (default: this "
    "machine's cores; each holds one configuration's records in memory; with "
    "--executor ray, Ray's CPUs decide instead).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where configurations run: processes here, or Ray tasks (pip install "
    "'sessiongen[ray]'; sessiongen installed on every node).",
)
@click.option(
    "--address",
    metavar="ADDR",
    help="The Ray cluster to use (ray.init's address: auto, ray://HOST:10001); default: "
    "RAY_ADDRESS, else a local Ray instance.",
)
@click.option(
    "--seeds",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Replicates per configuration: the scenario's seed, then seed+1, ... (arrivals, "
    "pauses, lengths; and the fit's parameter draws when the profile carries them), "
    "their sessions pooled for the intervals.",
)
@click.option(
    "--pays-at",
    type=click.FloatRange(min=0, min_open=True),
    default=1.1,
    show_default=True,
    help="The session gain (OFF / ON) the pool must reach: its 95% interval wholly at or "
    "above it pays, wholly below does not pay, straddling it is undecided.",
)
@click.option(
    "--find",
    "find_spec",
    metavar="KEY=LOW:HIGH",
    help="Bisect one numeric key for where each cell's verdict changes, e.g. --find "
    "target.sim.pool_capacity_gib=1:256 (integers when both ends are).",
)
@click.option(
    "--find-by",
    type=click.Choice(["verdict", "objective"]),
    default="verdict",
    show_default=True,
    help="What --find brackets: the pool's verdict, or where each cache arm stops meeting "
    "the scenario's [objective] (goodput's interval against its attainment).",
)
@click.option(
    "--find-steps",
    type=click.IntRange(1),
    default=6,
    show_default=True,
    help="Halvings per boundary of --find (each plans every configuration and seed).",
)
@click.option(
    "--sensitivity/--no-sensitivity",
    default=True,
    show_default=True,
    help="Read each verdict again at both ends of every profile parameter's box (its "
    "fitted interval, else +-10%): one more run per configuration, parameter and end; "
    "the table says which parameter flips a verdict.",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
@set_option
def plan_cmd(
    scenario_file: str,
    varies: tuple[str, ...],
    profile: str | None,
    runs_dir: str,
    tokens: str,
    jobs: int | None,
    executor: str,
    address: str | None,
    seeds: int,
    pays_at: float,
    find_spec: str | None,
    find_by: str,
    find_steps: int,
    sensitivity: bool,
    progress: bool,
    overrides: tuple[str, ...],
) -> None:
    """Answer what-if questions on the simulator's virtual clock (no server, no waiting).

    Replays SCENARIO_FILE once per combination of the --vary values, on the same engine
    as the simulated pair, and writes runs/plan-.../ with one run folder per
    configuration, whatif.parquet, turns.parquet and a report. Configurations run in
    parallel, over this machine's cores (--jobs) or as Ray tasks (--executor ray); the
    tables are the same either way. Every figure is the simulator's (fit it to your
    hardware with sessiongen fit), never a measurement.

    Each configuration runs --seeds times; the decision table gives the pool's gain
    (whole session, later turns) and goodput with 95% intervals and a verdict against
    --pays-at. --find KEY=LOW:HIGH bisects one key for where the verdict changes
    (--find-by objective: where each arm stops meeting the objective).
    """
    from sessiongen.capacity import plan as plan_mod
    from sessiongen.capacity.grid import Config, Vary
    from sessiongen.capacity.sweep import Executor, SweepOptions
    from sessiongen.capacity.virtual import Tokens

    parsed = [Vary.parse(v) for v in varies]
    sets = (*((f"target.sim.profile={profile}",) if profile else ()), *overrides)
    sweep = SweepOptions(jobs, cast(Executor, executor), address)
    if find_spec is not None:
        from sessiongen.capacity.find import FindBy, find

        def point(value: float, rows: object) -> None:
            click.echo(f"planned {find_spec.partition('=')[0]}={value:g}")

        found = find(
            scenario_file, find_spec, overrides=sets, varies=parsed, runs_dir=Path(runs_dir),
            tokens=cast(Tokens, tokens), sweep=sweep, seeds=seeds, pays_at=pays_at,
            steps=find_steps, on_point=point, by=cast(FindBy, find_by),
        )  # fmt: skip
        click.echo(
            plan_mod.console_table(found.out, [Vary(found.key, ()), *parsed], decision_only=True)
        )
        if found.by == "objective":
            click.echo(f"Where each arm stops meeting the objective ({seeds} seeds):")
        else:
            click.echo(f"Where the verdict flips (pays at {pays_at:g}, {seeds} seeds):")
        for line in found.lines():
            click.echo(f"  {line}")
        click.echo(f"find: {found.out}")
        click.echo(f"report: {found.out / 'report' / 'report.md'}")
        return
    total = seeds
    for v in parsed:
        total *= len(v.values)
    finished: list[int] = []

    def done(config: Config, run_dir: Path) -> None:
        finished.append(config.index)
        if len(finished) <= total:
            click.echo(f"[{len(finished)}/{total}] {config.label}: {run_dir}")
        else:  # the ends of the sensitivity box, after the grid
            click.echo(f"[sensitivity {len(finished) - total}] {config.label}: {run_dir}")

    out = plan_mod.plan(
        scenario_file,
        overrides=sets,
        varies=parsed,
        runs_dir=Path(runs_dir),
        tokens=cast(Tokens, tokens),
        progress=progress,
        sweep=sweep,
        on_config=done,
        seeds=seeds,
        pays_at=pays_at,
        sensitivity=sensitivity,
    )
    click.echo(plan_mod.console_table(out, parsed))
    click.echo(f"plan: {out}")
    click.echo(f"report: {out / 'report' / 'report.md'}")


@cli.command("calibrate")
@click.argument("scenario_file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--concurrency", type=click.IntRange(1), help="Streams at once (default: the scenario's)."
)
@click.option(
    "--body-kb",
    type=click.FloatRange(min=0, min_open=True),
    help="Request body size, KiB (default: the scenario's).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds of steady state (a p99 needs 662 requests).",
)
@set_option
def calibrate_cmd(
    scenario_file: str | None,
    concurrency: int | None,
    body_kb: float | None,
    duration: float,
    overrides: tuple[str, ...],
) -> None:
    """Measure the client's own added TTFT against a reference server.

    The reference server (its own process) answers after a known delay and stamps its
    own receive and send times, so added TTFT = client TTFT - server time: what the
    driver, the loopback and parsing add. Load defaults to SCENARIO_FILE's concurrency
    and turn-1 body size (64 streams of 0.5 MiB without a scenario). Prints the verdict
    (what the client adds at p50 and at its highest honest tail, and above which TTFT
    that is under 1% and 2%), then the figures, every tail with its sample count.
    """
    from sessiongen.calibrate.measure import calibrate, scenario_load
    from sessiongen.calibrate.verdict import DEFINITION, figure_lines

    conc, body = 64, 512 * 1024
    if scenario_file:
        conc, body = scenario_load(load_scenario(scenario_file, overrides))
    conc = concurrency or conc
    body = int(body_kb * 1024) if body_kb else body
    click.echo(
        f"calibrating at {conc} concurrent streams, {body / 1024:.0f} KiB bodies, "
        f"{duration:g} s of steady state ...",
        err=True,
    )
    figures = calibrate(conc, body, duration_s=duration)
    click.echo(f"verdict: {figures['verdict']}")
    click.echo(f"({DEFINITION})")
    for line in figure_lines(figures):
        click.echo(line)


def main(argv: list[str] | None = None) -> None:
    """Entry point for the console script and ``python -m sessiongen``.

    Usage errors (a missing argument, a path that is a file where a folder is wanted)
    print as one line naming the option, like every other user error, exit status 2.
    """
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
