#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/stage.sh installed the stack: the issue-35 run.
#
#   bash scripts/gpu/run.sh start   # facts, the 1B model, then the runs in the background
#   bash scripts/gpu/run.sh wait    # wait for them (at most $GPU_WAIT_S), pack into $OUT
#   bash scripts/gpu/run.sh pack    # pack whatever is there into $OUT now
#   bash scripts/gpu/run.sh dry     # both replays' --dry-run: checks the overrides
#
# The runs (one background job, started with setsid so that it outlives the call; the
# machine keeps it only while it stays warm): a scaled study, scenarios/alt32k.toml
# (alternate and fixed placement, 32k contexts, 6 sessions an arm, OFF-ON-ON-OFF), then
# the cross-replica probe chains, scenarios/xreplica.toml, at 32k and at the largest
# context the replicas hold. Both on the managed target on cuda: two replicas of
# builtin:llama-1b on GPU 0 beside one LMCache server, caches reset between blocks of the
# same arm (each reset proved by a cold probe), so both arms see the same prompts and the
# equivalence probe compares their answers.
#
# Knobs (environment): GPU_SESSIONS (study sessions an arm, 6), GPU_PROBE=0 (no probe
# chains), GPU_LARGEST_CONTEXT (258048), GPU_KV_BYTES (each replica's KV cache, 9 GiB),
# GPU_MAX_MODEL_LEN (262144), GPU_WAIT_S (how long `wait` waits), GPU_EXTRA_ARGS_FILE (more replay arguments, one a
# line, after the ones here), GPU_SITE, GPU_WORK, PYTHON.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SITE=${GPU_SITE:-/tmp/site}
WORK=${GPU_WORK:-/root/gpu-work}
PY=${PYTHON:-python3}
export PYTHONPATH="$SITE:$REPO" PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LARGEST=${GPU_LARGEST_CONTEXT:-258048}  # max_model_len 262144 less room for the turns
KV_BYTES=${GPU_KV_BYTES:-9663676416}      # 9 GiB a replica: 294,912 tokens at 32 KiB
MAX_LEN=${GPU_MAX_MODEL_LEN:-262144}      # the model's positions; the KV cache must hold it
mkdir -p "$WORK"

# Every managed pair: two replicas sharing GPU 0 (0.3 of its memory each, a fixed
# 9 GiB KV cache so that concurrent start-ups cannot skew each other's memory
# profile), eager (vLLM captures CUDA graphs only up to 512 tokens: a long prefill runs
# eager either way, and start-ups take seconds, not minutes), one LMCache pool of 20 GB
# (two chains of the largest context, 8 GiB each, fit it).
common_sets() {
    local preload env
    preload=$(cat "$SITE/lmcache-preload" 2>/dev/null)
    env="CUDA_VISIBLE_DEVICES = \"0\"${preload:+, LD_PRELOAD = \"$preload\"}"
    printf '%s\n' --set target.kind=managed --set target.managed.device=cuda \
        --set target.managed.model=builtin:llama-1b --set model.name=llama-1b \
        --set sessions.probe=equivalence --set design.restart_between_blocks=false \
        --set target.managed.pool_size_gb=20 --set "target.managed.max_model_len=$MAX_LEN" \
        --set "target.managed.env={$env}" \
        --set "target.managed.vllm_args=[\"--enforce-eager\",\"--gpu-memory-utilization\",\"0.3\",\"--kv-cache-memory-bytes\",\"$KV_BYTES\"]"
    # more arguments for both replays, one a line (a rehearsal on CPU uses it)
    if [ -n "${GPU_EXTRA_ARGS_FILE:-}" ]; then cat "$GPU_EXTRA_ARGS_FILE"; fi
}

facts() {
    {
        echo "# issue 35 GPU run: $(date -u +%FT%TZ)"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        uname -r
        "$PY" - <<'PYEOF'
import json, math
from sessiongen.launch import commands, tinymodel
r = tinymodel.LLAMA_1B
params = sum(math.prod(s) for s in tinymodel.weight_shapes(r).values())
print(json.dumps({"versions": commands.stack_versions(), "model": r.name,
                  "parameters": params, "kv_bytes_per_token": tinymodel.kv_bytes_per_token(r),
                  "weight_std": r.weight_std, "config": r.config}, indent=1))
PYEOF
        echo "lmcache preload: '$(cat "$SITE/lmcache-preload" 2>/dev/null)'"
        "$PY" -m pip list 2>/dev/null | grep -iE '^(numpy|numba|protobuf|grpcio|prometheus.client|pillow|setuptools|triton|torch|transformers) '
    } > "$WORK/facts.txt" 2>&1
    cat "$WORK/facts.txt"
}

replays() {  # the two replays' arguments, one a line group: study, then probe
    mapfile -t sets < <(common_sets)
    STUDY=(scenarios/alt32k.toml "${sets[@]}" --set "sessions.count=${GPU_SESSIONS:-6}")
    PROBE=(scenarios/xreplica.toml "${sets[@]}"
        --set "sessions.initial_context_tokens=[32768, $LARGEST]")
}

job() {  # the background job: each step's exit status goes to $WORK/status
    local start=$SECONDS
    "$PY" - <<'PYEOF' > "$WORK/model.log" 2>&1
import time
from sessiongen.launch import commands, tinymodel
t = time.monotonic()
dest = commands.default_model_cache().parent / tinymodel.LLAMA_1B.cache_dir
tinymodel.build_tiny_model(dest, recipe=tinymodel.LLAMA_1B)
print(f"model built in {time.monotonic() - t:.1f} s: {tinymodel.tiny_model_identity(dest)}")
PYEOF
    echo "model $? $((SECONDS - start))" >> "$WORK/status"
    replays
    "$PY" -m sessiongen replay "${STUDY[@]}" --runs-dir "$WORK/runs" --no-progress \
        > "$WORK/study.log" 2>&1
    echo "study $? $((SECONDS - start))" >> "$WORK/status"
    if [ "${GPU_PROBE:-1}" = 1 ]; then
        "$PY" -m sessiongen replay "${PROBE[@]}" --runs-dir "$WORK/runs" --no-progress \
            > "$WORK/probe.log" 2>&1
        echo "probe $? $((SECONDS - start))" >> "$WORK/status"
    fi
    echo "done" >> "$WORK/status"
}

pack() {
    [ -n "${OUT:-}" ] || { echo "run: OUT is not set"; return 1; }
    local tails="$WORK/log-tails"
    rm -rf "$tails" && mkdir -p "$tails"
    find "$WORK/runs" -name '*.log' 2>/dev/null | while read -r log; do
        rel=${log#"$WORK/runs/"}
        mkdir -p "$tails/$(dirname "$rel")" && tail -n 400 "$log" > "$tails/$rel"
    done
    cp "$WORK"/*.log "$WORK/status" "$WORK/facts.txt" "$tails/" 2>/dev/null
    cp "${GPU_PARTS:-/root/gpu-parts}"/cuda_ops.err "$tails/" 2>/dev/null
    tar -czf "$OUT/runs.tar.gz" -C "$WORK" --exclude='*.log' runs 2>/dev/null
    tar -czf "$OUT/logs.tar.gz" -C "$WORK" log-tails
    cp "$WORK/facts.txt" "$WORK/status" "$OUT/" 2>/dev/null
    ls -l "$OUT"
}

case "${1:-}" in
start)
    cd "$REPO" || exit 1
    [ -f "$SITE/lmcache-preload" ] || { echo "run: stage.sh has not installed the stack"; exit 1; }
    facts
    bash "$HERE/run.sh" dry || exit 1
    rm -f "$WORK/status"
    setsid nohup bash "$HERE/run.sh" job > "$WORK/job.log" 2>&1 < /dev/null &
    echo $! > "$WORK/job.pid"
    echo "run: background job started (pid $!); next: bash scripts/gpu/run.sh wait"
    GPU_WAIT_S=${GPU_WAIT_S:-360} bash "$HERE/run.sh" wait
    ;;
dry)  # both replays' blocks, nothing run: the overrides are checked before any start
    cd "$REPO" || exit 1
    replays
    "$PY" -m sessiongen replay "${STUDY[@]}" --dry-run --runs-dir "$WORK/dry" || exit 1
    "$PY" -m sessiongen replay "${PROBE[@]}" --dry-run --runs-dir "$WORK/dry" || exit 1
    ;;
job) cd "$REPO" && job ;;
wait)
    deadline=$((SECONDS + ${GPU_WAIT_S:-540}))
    while [ $SECONDS -lt $deadline ] && ! grep -q '^done' "$WORK/status" 2>/dev/null; do
        if ! kill -0 "$(cat "$WORK/job.pid" 2>/dev/null)" 2>/dev/null; then
            echo "run: the background job is gone without finishing (job.log below)"
            tail -n 20 "$WORK/job.log" 2>/dev/null
            break
        fi
        sleep 15
        echo "run: $(date -u +%T) status: $(tr '\n' ';' 2>/dev/null < "$WORK/status")" \
            "$(tail -n 1 "$WORK/study.log" 2>/dev/null | cut -c1-120)"
    done
    cat "$WORK/status" 2>/dev/null
    tail -n 25 "$WORK/study.log" "$WORK/probe.log" 2>/dev/null
    pack
    ;;
pack) pack ;;
*) echo "usage: run.sh start|wait|pack|dry" >&2; exit 2 ;;
esac
