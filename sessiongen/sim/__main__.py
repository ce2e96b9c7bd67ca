"""``python -m sessiongen.sim``: serve the simulated replicas (used by ``start_sim``).

::

    python -m sessiongen.sim [--replicas N] [--port BASE] [--host H] [--model NAME]
        [--shared-cache on|off] [--time-scale X] [--set PARAM=VALUE ...]
        [--profile-json JSON] [--report-urls] [--exit-on-stdin-eof] [--log-level LEVEL]

``--set`` takes profile fields (``slowdown=1.2``; a ``target.sim.`` prefix is accepted),
applied over ``--profile-json``; ``--replicas`` and ``--time-scale`` win over both.
``--report-urls`` prints ``{"urls": [...], "pid": N}`` as one line on stdout once every
replica listens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from sessiongen.errors import UserError
from sessiongen.scenario.schema import apply_overrides, build
from sessiongen.scenario.simprofile import SimProfile
from sessiongen.sim.process import serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sessiongen.sim", description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=None, help="number of replicas")
    p.add_argument("--port", type=int, default=0, help="replica i on PORT+i (0: free ports)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="sim-27b", help="served model name")
    p.add_argument("--shared-cache", choices=("on", "off"), default="on")
    p.add_argument("--time-scale", type=float, default=None, help="wall s per modeled s")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PARAM=V")
    p.add_argument("--profile-json", default="{}", help="a whole profile as JSON")
    p.add_argument("--report-urls", action="store_true", help="print the URLs as JSON")
    p.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin closes")
    p.add_argument("--log-level", default="INFO")
    return p


def profile_from_args(args: argparse.Namespace) -> SimProfile:
    """The profile: JSON, then ``--set`` overrides, then ``--replicas``/``--time-scale``."""
    raw: dict[str, Any] = json.loads(args.profile_json)
    overrides = [o.removeprefix("target.sim.") for o in args.overrides]
    raw = apply_overrides(raw, overrides)
    if args.replicas is not None:
        raw["replicas"] = args.replicas
    if args.time_scale is not None:
        raw["time_scale"] = args.time_scale
    return build(SimProfile, raw, "sim profile")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        profile = profile_from_args(args)
    except (UserError, ValueError) as exc:
        print(f"python -m sessiongen.sim: error: {exc}", file=sys.stderr)
        return 2

    def report(urls: list[str]) -> None:
        if args.report_urls:
            sys.stdout.write(json.dumps({"urls": urls, "pid": os.getpid()}) + "\n")
            sys.stdout.flush()

    serve(
        profile,
        args.model,
        args.port,
        args.shared_cache == "on",
        args.host,
        on_ready=report,
        stop_on_stdin_eof=args.exit_on_stdin_eof,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
