"""The fit guide's excerpt: ``sessiongen fit`` on probe runs of the real CPU pair, its console.

    .venv/bin/python bench/fit_guide.py [RUN ...]

Runs the guide's fit command (``sessiongen fit RUN ... --kv-bytes-per-token N -o
fitted.toml``, N the KV bytes per token of ``builtin:tiny``, the model the real CPU pair
serves) on the RUNs, by default the probe runs of the development run of
``bench/heldout_decision.py`` (``runs/decomp/decision/runs/*-merged``: fitprobe, the loaded
fitprobe and fitprobe's second pass, each with its two arms merged), prints its console
and, with the default runs, writes to ``docs/data/fit_guide.json`` the lines the guide
shows: the fitted first-token and decode terms with their intervals, the interval line,
and the loaded terms with their residuals (``l00``, ``l01``, ... in the console's order,
``lines`` how many). Asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _docs import record

from sessiongen.scenario.models import kv_bytes_per_token

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "runs" / "decomp" / "decision" / "runs"
#: The console lines the guide shows: up to the first interval line, then the loaded part.
FIRST_BLOCK_ENDS = "intervals:"
LOADED_STARTS = "loaded terms"


def default_runs() -> list[Path]:
    return sorted(DEFAULT.glob("*-merged"))


def excerpt(console: list[str]) -> list[str]:
    """The guide's lines of a fit's console (module doc)."""
    out: list[str] = []
    for line in console:
        out.append(line)
        if line.startswith(FIRST_BLOCK_ENDS):
            break
    loaded = [i for i, line in enumerate(console) if line.startswith(LOADED_STARTS)]
    if loaded:
        out += ["..."]
        out += [line for line in console[loaded[0] :] if not line.startswith("profile:")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    args = parser.parse_args()
    runs = args.runs or default_runs()
    if not runs:
        raise SystemExit(f"no runs given and none under {DEFAULT}: run bench/heldout_decision.py")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "sessiongen", "fit", *map(str, runs),
                "--kv-bytes-per-token", str(kv_bytes_per_token()),
                "-o", str(Path(tmp) / "fitted.toml")]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    print(done.stdout, end="")
    if done.returncode:
        raise SystemExit(done.stderr.strip() or f"sessiongen fit exited {done.returncode}")
    lines = excerpt(done.stdout.splitlines())
    figures: dict[str, object] = {f"l{i:02d}": line for i, line in enumerate(lines)}
    figures["lines"] = len(lines)
    documented = argparse.Namespace(runs=[])
    record("fit_guide", figures, args=args, documented=documented)


if __name__ == "__main__":
    main()
