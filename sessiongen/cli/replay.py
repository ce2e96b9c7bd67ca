"""``sessiongen replay``: flags to a scenario and options, one replay, its outcome."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sessiongen import scenario as scenario_mod
from sessiongen.cli.common import (
    allow_arm_mismatch_option,
    load_scenario,
    pays_at_option,
    set_option,
)
from sessiongen.scenario.schema import check_field


@click.command("replay")
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
@pays_at_option(
    "The session gain (OFF / ON) the pool must reach, as for plan: its 95% interval "
    "wholly at or above it pays, wholly below does not pay, straddling it is undecided."
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
    from sessiongen import outcome

    result = replay_mod.replay(sc, opts)
    click.echo(f"run: {result.run_dir}")
    verdict = outcome.judge(
        result,
        strict_arms=sc.target.strict_arms,
        write_report=report,
        pays_at=pays_at,
        say=click.echo,
    )
    if verdict.interrupted:
        raise SystemExit(verdict.exit_status)
    if verdict.error is not None:
        raise verdict.error


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
