#!/usr/bin/env bash
# Install vllm-router (requirements-router.txt) into a virtual environment, default .venv,
# unless it is there at the pinned version. Idempotent, so `make test` can call it every time.
#
#   scripts/install-router.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
REQS=requirements-router.txt

if [ ! -x "$PY" ]; then
    echo "install-router: no virtual environment at $VENV (make install first)" >&2
    exit 2
fi
# Exit status 0 when every pin of the requirements file is installed at its version.
installed() {
    "$PY" - "$REQS" <<'PYEOF'
import importlib.metadata as md
import sys

for line in open(sys.argv[1], encoding="utf-8"):
    name, _, version = line.split("#", 1)[0].strip().partition("==")
    if not name:
        continue
    try:
        if md.version(name) != version:
            sys.exit(1)
    except md.PackageNotFoundError:
        sys.exit(1)
PYEOF
}
if installed; then
    echo "install-router: already installed in $VENV"
    exit 0
fi
echo "install-router: installing $(grep -v '^#' "$REQS" | xargs) into $VENV"
"$PY" -m pip install --quiet -r "$REQS"
"$PY" -m vllm_router.launch_router --help > /dev/null  # the launcher and its Rust core load
installed
echo "install-router: done"
