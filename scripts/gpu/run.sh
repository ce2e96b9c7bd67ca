#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/stage.sh installed the stack: the GPU runs.
#
#   bash scripts/gpu/run.sh start   # facts, every step's --dry-run, then the steps in the background
#   bash scripts/gpu/run.sh wait    # wait for them (at most $GPU_WAIT_S), pack into $OUT
#   bash scripts/gpu/run.sh pack    # pack whatever is there into $OUT now
#   bash scripts/gpu/run.sh dry     # every step's --dry-run: checks the overrides
#
# The steps (one background job, started with setsid so that it outlives the call; the
# machine keeps it only while it stays warm), each on the managed target on cuda: two
# replicas on GPU 0 beside one LMCache server in host memory, caches reset between blocks
# of the same arm (each reset proved by a cold probe), the equivalence probe comparing the
# arms' answers. Each step's records are kept as it ends, so a lease taken back keeps the
# steps already done. In order ($GPU_STEPS, default "probe8b study8b study1b"):
#   probe8b  builtin:llama-8b (Llama-3-8B's shape), scenarios/fitprobe.toml's probe chains
#            (cold, two local reuses, cross-replica, local reuse) at 8k, 32k, 64k and 128k,
#            pool off then on: the cross-replica TTFT at 128k with and without the pool,
#            and the runs `sessiongen fit` fits a GPU profile on
#   study8b  the same model, scenarios/alt32k.toml's six-turn study (alternate and fixed),
#            OFF then ON: the study's curves, and cells the fit never saw
#   study1b  builtin:llama-1b, alt32k alternate only, OFF then ON (the prepared first run)
#   chunk1b  study1b with LMCache chunks of 16 tokens, vLLM's block: a turn whose own prefix
#            cache ends inside a 256-token chunk (alternate turns 3-6) no longer starts its
#            pool load mid-chunk. On 2026-12-07 those turns, and only those, answered
#            differently from the pool-off arm (bench/gpu/equivalence.py); equal answers
#            here point at the mid-chunk load
#   noshim1b study1b with LMCache on its torch ops (no c10 shim, no compiled cuda_ops)
#   long8b   builtin:llama-8b on a card over 100 GB (an H200): scenarios/xreplica.toml's
#            chains at 128k and 256k, pool off then on: the cross-replica TTFT at the seed's
#            two contexts, and the largest context two 8B replicas on one card hold (each
#            0.45 of it: 14 GiB of weights + 40 GiB of KV, 327,680 tokens, + reserve; per
#            sessiongen/launch/memplan.py). On a smaller card it stops before any replay
#   heldout8b builtin:llama-8b, alt32k alternate at 2 sessions in flight, 8 sessions an arm,
#            OFF-ON-ON-OFF: a cell builtin:h100-llama8b's fit never saw, with enough
#            sessions for a verdict (bench/gpu/heldout.py plans it beside)
#   xreplica27b, study27b  two GPUs (a replica each) of builtin:llama-27b: the seed's own
#            setup (GPU_256K=1 adds the 256k probe where the card holds it)
#
# Knobs (environment): GPU_STEPS, GPU_SESSIONS (study8b sessions an arm, 4), GPU_SESSIONS_1B
# (the 1B steps', 5), GPU_WAIT_S
# (how long `wait` waits), GPU_EXTRA_ARGS_FILE (more arguments for every replay, one a
# line), GPU_SITE, GPU_WORK, PYTHON.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SITE=${GPU_SITE:-/tmp/site}
WORK=${GPU_WORK:-/root/gpu-work}
PY=${PYTHON:-python3}
export PYTHONPATH="$SITE:$REPO" PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEPS=${GPU_STEPS:-probe8b study8b study1b}
mkdir -p "$WORK"

# One managed pair of MODEL (llama-1b or llama-8b): two replicas sharing GPU 0, each a
# fixed KV cache (--kv-cache-memory-bytes: concurrent start-ups cannot skew each other's
# memory profile), eager (vLLM captures CUDA graphs only for short batches: a long
# prefill runs eager either way, and start-ups take seconds, not minutes).
#   llama-1b: 0.3 of the GPU each, 9 GiB of KV (294,912 tokens at 32 KiB), a 20 GB pool.
#   llama-8b: 0.45 each, 18 GiB of KV (147,456 tokens at 128 KiB: a 128k context and its
#   turns; 14.8 GB of weights + 19.3 GB of KV + activations fit 0.45 of an 80 GB H100),
#   a 40 GB pool (two 128k chains are 32 GiB).
pair_sets() {
    local model=$1 util kv pool len preload env
    case $model in
    llama-1b) util=0.3 kv=9663676416 pool=20 len=262144 ;;
    llama-8b) util=0.45 kv=19327352832 pool=40 len=139264 ;;
    llama-8b-long) util=0.45 kv=42949672960 pool=80 len=266240 ;;
    llama-27b) util=0.95 pool=${GPU_POOL_GB:-200} len=264192 ;;  # one replica per GPU
    esac
    preload=$(cat "$SITE/lmcache-preload" 2>/dev/null)
    env="CUDA_VISIBLE_DEVICES = \"0\"${preload:+, LD_PRELOAD = \"$preload\"}"
    if [ "$model" = llama-27b ]; then
        # two GPUs, a replica each: bfloat16 where the card holds 47 GiB of weights and a
        # 256k KV cache (H200), FP8 weights and 128k on an 80 GB card
        # (sessiongen/launch/memplan.py; tests/unit/launch/test_memplan.py)
        env="CUDA_VISIBLE_DEVICES = \"0,1\"${preload:+, LD_PRELOAD = \"$preload\"}"
        if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null)" -gt 100000 ] 2>/dev/null; then
            quant='' len=264192 kv=68719476736
        else
            quant='"--quantization","fp8",' len=139264 kv=34359738368
        fi
        printf '%s\n' --set target.kind=managed --set target.managed.device=cuda \
            --set target.managed.model=builtin:llama-27b --set model.name=llama-27b \
            --set sessions.probe=equivalence --set design.restart_between_blocks=false \
            --set target.managed.gpus_per_replica=1 \
            --set "target.managed.pool_size_gb=$pool" --set "target.managed.max_model_len=$len" \
            --set driver.request_timeout_s=900 --set "target.managed.env={$env}" \
            --set "target.managed.vllm_args=[\"--enforce-eager\",${quant}\"--gpu-memory-utilization\",\"$util\",\"--kv-cache-memory-bytes\",\"$kv\"]"
        if [ -n "${GPU_EXTRA_ARGS_FILE:-}" ]; then cat "$GPU_EXTRA_ARGS_FILE"; fi
        return
    fi
    printf '%s\n' --set target.kind=managed --set target.managed.device=cuda \
        --set "target.managed.model=builtin:${model%-long}" --set "model.name=${model%-long}" \
        --set sessions.probe=equivalence --set design.restart_between_blocks=false \
        --set "target.managed.pool_size_gb=$pool" --set "target.managed.max_model_len=$len" \
        --set driver.request_timeout_s=600 \
        --set "target.managed.env={$env}" \
        --set "target.managed.vllm_args=[\"--enforce-eager\",\"--gpu-memory-utilization\",\"$util\",\"--kv-cache-memory-bytes\",\"$kv\"]"
    # more arguments for every replay, one a line (a rehearsal on CPU uses it)
    if [ -n "${GPU_EXTRA_ARGS_FILE:-}" ]; then cat "$GPU_EXTRA_ARGS_FILE"; fi
}

step_args() {  # ARGS: the replay arguments of step $1; MODEL: its built-in model
    local sets
    case $1 in
    probe8b)
        MODEL=llama-8b
        mapfile -t sets < <(pair_sets "$MODEL")
        ARGS=(scenarios/fitprobe.toml "${sets[@]}" --set sessions.count=2
            --set "sessions.initial_context_tokens=[8192, 32768, 65536, 131072]") ;;
    study8b)
        MODEL=llama-8b
        mapfile -t sets < <(pair_sets "$MODEL")
        ARGS=(scenarios/alt32k.toml "${sets[@]}" --set "sessions.count=${GPU_SESSIONS:-4}"
            --set 'design.blocks=["off","on"]') ;;
    study1b)
        MODEL=llama-1b
        mapfile -t sets < <(pair_sets "$MODEL")
        ARGS=(scenarios/alt32k.toml "${sets[@]}" --set "sessions.count=${GPU_SESSIONS_1B:-5}"
            --set 'placement.policies=["alternate"]' --set 'design.blocks=["off","on"]') ;;
    xreplica27b)  # two GPUs: the seed's cross-replica probe at 128k (and 256k on H200s)
        MODEL=llama-27b
        mapfile -t sets < <(pair_sets "$MODEL")
        ARGS=(scenarios/xreplica.toml "${sets[@]}" --set sessions.count=2
            --set "sessions.initial_context_tokens=[32768, 131072${GPU_256K:+, 258048}]") ;;
    study27b)  # two GPUs: the six-turn study at 32k and 128k, OFF-ON-ON-OFF
        MODEL=llama-27b
        mapfile -t sets < <(pair_sets "$MODEL")
        ARGS=(scenarios/alt32k.toml "${sets[@]}" --set "sessions.count=${GPU_SESSIONS:-4}"
            --set "sessions.initial_context_tokens=[32768, 131072]") ;;
    heldout8b)
        MODEL=llama-8b
        mapfile -t sets < <(pair_sets "$MODEL")
        ARGS=(scenarios/alt32k.toml "${sets[@]}" --set "sessions.count=${GPU_SESSIONS:-8}"
            --set 'placement.policies=["alternate"]' --set driver.concurrency=2) ;;
    chunk1b)
        step_args study1b && ARGS+=(--set target.managed.chunk_size=16) ;;
    long8b)
        if ! [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null)" -gt 100000 ] 2>/dev/null; then
            echo "run: long8b needs a card over 100 GB (a 256k KV cache beside a second replica); this one: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader -i 0 2>/dev/null)" >&2
            return 2
        fi
        MODEL=llama-8b
        mapfile -t sets < <(pair_sets llama-8b-long)
        ARGS=(scenarios/xreplica.toml "${sets[@]}" --set sessions.count=2
            --set 'design.blocks=["off","on"]'
            --set "sessions.initial_context_tokens=[131072, 262144]") ;;
    noshim1b)
        step_args study1b
        mapfile -t sets < <(SITE=/nonexistent pair_sets "$MODEL")
        ARGS=(scenarios/alt32k.toml "${sets[@]}" --set "sessions.count=${GPU_SESSIONS_1B:-5}"
            --set 'placement.policies=["alternate"]' --set 'design.blocks=["off","on"]') ;;
    *) echo "run: unknown step $1" >&2; return 2 ;;
    esac
}

facts() {
    {
        echo "# GPU run: $(date -u +%FT%TZ)"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        uname -r
        "$PY" - <<'PYEOF'
import json, math
from sessiongen.launch import commands, tinymodel
models = {}
for r in (tinymodel.LLAMA_1B, tinymodel.LLAMA_8B, tinymodel.LLAMA_27B):
    params = sum(math.prod(s) for s in tinymodel.weight_shapes(r).values())
    models[r.name] = {"parameters": params, "kv_bytes_per_token": tinymodel.kv_bytes_per_token(r),
                      "weight_std": r.weight_std, "config": r.config}
print(json.dumps({"versions": commands.stack_versions(), "models": models}, indent=1))
PYEOF
        echo "lmcache preload: '$(cat "$SITE/lmcache-preload" 2>/dev/null)'"
        "$PY" -m pip list 2>/dev/null | grep -iE '^(numpy|numba|protobuf|grpcio|prometheus.client|pillow|setuptools|triton|torch|transformers) '
        free -g | head -2
    } > "$WORK/facts.txt" 2>&1
    cat "$WORK/facts.txt"
}

build_model() {  # build builtin:$1 once (idempotent), timed into $WORK/model-$1.log
    "$PY" - "$1" <<'PYEOF' >> "$WORK/model-$1.log" 2>&1
import sys, time
from sessiongen.launch import commands, tinymodel
recipe = tinymodel.RECIPES["builtin:" + sys.argv[1]]
t = time.monotonic()
dest = commands.default_model_cache().parent / recipe.cache_dir
tinymodel.build_tiny_model(dest, recipe=recipe)
print(f"model built in {time.monotonic() - t:.1f} s: {tinymodel.tiny_model_identity(dest)}")
PYEOF
}

job() {  # the background job: each step's exit status and elapsed seconds go to $WORK/status
    local start=$SECONDS step
    for step in $STEPS; do
        step_args "$step" || continue
        build_model "$MODEL"
        echo "model-$MODEL $? $((SECONDS - start))" >> "$WORK/status"
        "$PY" -m sessiongen replay "${ARGS[@]}" --runs-dir "$WORK/runs" --no-progress \
            > "$WORK/$step.log" 2>&1
        echo "$step $? $((SECONDS - start))" >> "$WORK/status"
    done
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
dry)  # every step's blocks, nothing run: the overrides are checked before any start
    cd "$REPO" || exit 1
    for step in $STEPS; do
        step_args "$step" || exit 1
        "$PY" -m sessiongen replay "${ARGS[@]}" --dry-run --runs-dir "$WORK/dry" > "$WORK/dry-$step.log" 2>&1 \
            || { tail -n 5 "$WORK/dry-$step.log"; exit 1; }
        echo "run: $step --dry-run ok ($(grep -c . "$WORK/dry-$step.log") lines)"
    done
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
            "$(tail -q -n 1 "$WORK"/probe8b.log "$WORK"/study*.log 2>/dev/null | tail -n 1 | cut -c1-120)"
    done
    cat "$WORK/status" 2>/dev/null
    for step in $STEPS; do tail -n 12 "$WORK/$step.log" 2>/dev/null; done
    pack
    ;;
pack) pack ;;
*) echo "usage: run.sh start|wait|pack|dry" >&2; exit 2 ;;
esac
