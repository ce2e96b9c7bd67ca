"""``sessiongen sim serve`` and ``python -m sessiongen.sim``: one command, one set of defaults.

::

    sessiongen sim serve [--replicas N] [--port BASE] [--host H] [--model NAME]
        [--shared-cache on|off] [--time-scale X] [--set target.sim.PARAM=VALUE ...]
    sessiongen sim switch --shared-cache on|off URL [URL ...]

``sim switch`` switches replicas that ``sim serve`` runs to the other arm and empties
every cache, as restarting real replicas with or without the KV connector would: a
``replay --switch-command`` for the simulator.

Hidden options serve :func:`sessiongen.sim.process.start_sim`, which runs the same
command in a child process: ``--profile-json`` (a whole profile, under the ``--set``
overrides), ``--report-urls`` (one JSON line ``{"urls": [...], "pid": N}`` on stdout once
every replica listens), ``--exit-on-stdin-eof`` and ``--log-level``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from typing import Any

import click

from sessiongen.errors import EndpointError
from sessiongen.scenario.schema import apply_overrides, build, parse_override
from sessiongen.scenario.simprofile import SimProfile


def profile_from_options(
    profile_json: str | None, overrides: tuple[str, ...], replicas: int | None, time_scale: float
) -> SimProfile:
    """The profile: JSON (if any), then ``--set`` overrides, then ``--replicas`` and
    ``--time-scale``; errors are one line naming the option."""
    try:
        raw: dict[str, Any] = json.loads(profile_json) if profile_json else {}
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--profile-json") from None
    for text in overrides:
        parse_override(text, "--set")  # a one-line error for a malformed override
    raw = apply_overrides(raw, [o.removeprefix("target.sim.") for o in overrides])
    if replicas is not None:
        raw["replicas"] = replicas
    if time_scale:
        raw["time_scale"] = time_scale
    elif not profile_json:
        raw.setdefault("time_scale", 1.0)  # by hand: real time unless asked otherwise
    return build(SimProfile, raw, "--set target.sim")


@click.command("serve")
@click.option("--replicas", type=click.IntRange(1, 64), default=None, help="[default: 2]")
@click.option(
    "--port", type=int, default=8100, show_default=True, help="Replica i on PORT+i (0: free)."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--model", default="sim-27b", show_default=True, help="Served model name.")
@click.option("--shared-cache", type=click.Choice(["on", "off"]), default="on", show_default=True)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Wall s per modeled s [default: 1, or the profile's with --profile-json].",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="target.sim.PARAM=VALUE",
    help="Override a profile parameter (repeatable).",
)
@click.option("--profile-json", hidden=True, default=None)
@click.option("--report-urls", is_flag=True, hidden=True)
@click.option("--exit-on-stdin-eof", is_flag=True, hidden=True)
@click.option("--log-level", hidden=True, default="INFO")
def serve_command(
    replicas: int | None,
    port: int,
    host: str,
    model: str,
    shared_cache: str,
    time_scale: float | None,
    overrides: tuple[str, ...],
    profile_json: str | None,
    report_urls: bool,
    exit_on_stdin_eof: bool,
    log_level: str,
) -> None:
    """Serve simulated replicas until interrupted, one log line per request.

    Profile parameters are set with --set target.sim.PARAM=VALUE (see
    sessiongen/scenario/simprofile.py). The servers speak vLLM's OpenAI-compatible
    API, /metrics, /tokenize and /health; they are a model, not a real engine.
    """
    # The server stack (aiohttp's web server, the engine) loads only when serving.
    from sessiongen.sim.process import serve

    profile = profile_from_options(profile_json, overrides, replicas, time_scale or 0.0)
    logging.basicConfig(
        stream=sys.stderr,
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    def ready(urls: list[str]) -> None:
        if report_urls:
            sys.stdout.write(json.dumps({"urls": urls, "pid": os.getpid()}) + "\n")
            sys.stdout.flush()
        else:
            click.echo(
                "SIMULATED replicas (a model of vLLM + LMCache): " + " ".join(urls), err=True
            )

    with contextlib.suppress(KeyboardInterrupt):
        serve(
            profile,
            model,
            port,
            shared_cache == "on",
            host,
            on_ready=ready,
            stop_on_stdin_eof=exit_on_stdin_eof,
        )


@click.command("switch")
@click.argument("urls", nargs=-1, required=True)
@click.option("--shared-cache", type=click.Choice(["on", "off"]), required=True)
def switch_command(urls: tuple[str, ...], shared_cache: str) -> None:
    """Switch the simulated replicas at URLS (one sim serve) to --shared-cache and empty
    every cache and the pool, as restarting real replicas would."""
    bases = [u.rstrip("/") for u in urls]
    steps = [(bases[0] + "/sim/config", {"shared_cache": shared_cache == "on"})]
    steps += [(url + "/sim/reset", {"pool": i == 0}) for i, url in enumerate(bases)]
    from sessiongen.infra.net import http_post_json  # urllib: only this command needs it

    for url, body in steps:
        status, answer = http_post_json(url, body, timeout_s=10.0)
        if status != 200:
            raise EndpointError(f"POST {url}: HTTP {status}: {answer}")
    click.echo(f"simulated replicas switched to shared cache {shared_cache}: {' '.join(bases)}")
