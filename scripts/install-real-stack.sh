#!/usr/bin/env bash
# Install the real CPU stack (requirements-real.txt) into a virtual environment, default
# .venv, unless it is there already. Idempotent, so `make test` can call it every time.
#
#   scripts/install-real-stack.sh [VENV]
#
# The uninstall step is part of the recipe: PyPI's torchvision fails to import beside the
# CPU torch ("operator torchvision::nms does not exist"), transformers imports it when it
# is present, and vLLM then crashes at start-up. Nothing sessiongen uses needs it.
#
# pip writes no bytecode here (--no-compile): compiling every module of torch, vLLM,
# transformers and their dependencies was half of the install (71 s with it, 34 s
# without, 2 cores), and a replica imports a small part of them. The import check at the
# end imports what the servers import (API server, engine core, CPU worker, LMCache's
# server and connector), which writes that part's bytecode once (about 6 s) before any
# replica starts (whatever PYTHONDONTWRITEBYTECODE says); anything else is compiled by the
# first process that imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
REQS=requirements-real.txt

# Exit status 0 when every pinned distribution is installed at its version and the
# torchvision family is absent.
installed() {
    "$PY" - "$REQS" <<'PYEOF'
import importlib.metadata as md
import importlib.util
import sys

for line in open(sys.argv[1], encoding="utf-8"):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, version = line.partition("==")
    try:
        if md.version(name) != version:
            sys.exit(1)
    except md.PackageNotFoundError:
        sys.exit(1)
for unwanted in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(unwanted) is not None:
        sys.exit(1)
PYEOF
}

if [ ! -x "$PY" ]; then
    echo "install-real-stack: no virtual environment at $VENV (make install first)" >&2
    exit 2
fi
if installed; then
    echo "install-real-stack: already installed in $VENV"
    exit 0
fi
echo "install-real-stack: installing $(grep -v '^#' "$REQS" | xargs) into $VENV"
start=$SECONDS
"$PY" -m pip install --quiet --no-compile -r "$REQS"
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
env -u PYTHONDONTWRITEBYTECODE "$PY" -c "import vllm.entrypoints.openai.api_server, vllm.v1.engine.core, vllm.v1.worker.cpu_worker, \
vllm.model_executor.models.llama, lmcache.cli.main, lmcache.v1.multiprocess.http_server, \
lmcache.integration.vllm.lmcache_mp_connector"
installed
echo "install-real-stack: done in $((SECONDS - start)) s"
