#!/usr/bin/env bash
# The GPU comparison, in one run on a machine with an NVIDIA GPU and PyTorch but no Rust and no
# network: weft's `cuda` build against ComfyUI and diffusers (PyTorch SDPA), side by side, on
# ComfyUI's default graph with the random-weight checkpoints, 20 steps:
#   - SD1.5 at 512x512, batch 1: weft in float16 (and with its flash-attention kernel),
#     bfloat16 and float32; ComfyUI in its default mode and with --force-fp32;
#   - SD1.5 at 512x512, batch 4, and SDXL at 1024x1024, batch 1 and 4: weft float16 against
#     ComfyUI's default and diffusers float16;
#   - the images' differences: ComfyUI float16 against its float32 (the tolerance), and weft's
#     against ComfyUI's;
#   - GPU utilisation (nvidia-smi dmon) while each runs.
#
#     scripts/bench-gpu.sh [WEFT] [OUT]
#
# WEFT is the `cuda` build (default .gpu/weft, else .gpu/weft.xz unpacked); ComfyUI's tree is
# .gpu/comfyui and the Python wheels the machine lacks (diffusers, ComfyUI's requirements) are
# .gpu/whl: `scripts/gpu-bundle.sh` prepares all three on a machine with the network.
# Everything is logged under OUT (default $OUT, else /tmp/bench-gpu); the summary is
# OUT/summary.txt. Each part has its own time limit and the run goes on when one fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${2:-${OUT:-/tmp/bench-gpu}}
mkdir -p "$out/images"
weft=${1:-.gpu/weft}
if [ ! -x "$weft" ] && [ -f .gpu/weft.xz ]; then
    weft=/tmp/weft
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        .gpu/weft.xz "$weft" && chmod +x "$weft"
fi
weft=$(realpath "$weft")
summary=$out/summary.txt
note() { echo "== $(date +%T) $*" | tee -a "$summary"; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 WEFT_CACHE_DIR=/tmp/weft-cache
# The CUDA libraries weft links (PyTorch's wheels carry them).
libs=$(find /opt /usr/local /usr/lib -xdev \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' \
    -o -name 'libcudart.so.13' -o -name 'libcurand.so.10' -o -name 'libnvrtc.so.13' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    python3 -c 'import torch, diffusers; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "diffusers", diffusers.__version__)'
    uptime
    ldd "$weft" | grep -E 'cud|nvrtc|cublas|curand' || true
} 2>&1 | tee -a "$summary"

# Runs `bench-sd15-graph.py` with ARGS under a time limit of SECONDS, GPU utilisation logged
# beside it; the log is OUT/NAME.log and its figures go to the summary.
bench() {
    local name=$1 seconds=$2
    shift 2
    note "$name: $*"
    nvidia-smi dmon -s um -d 1 > "$out/$name.dmon" 2>&1 &
    local dmon=$!
    timeout "$seconds" python3 scripts/bench-sd15-graph.py --weft "$weft" --no-generate --save-images "$out/images" "$@" \
        > "$out/$name.log" 2>&1
    echo "   exit $?" >> "$summary"
    kill "$dmon" 2>/dev/null
    grep -E 'end to end|sampler step|faster|ComfyUI .*end|error|Error' "$out/$name.log" | sed 's/^/   /' >> "$summary"
    # dmon's header names the columns: mean SM use over the run and the most memory held.
    awk '/^# *gpu/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
         $1 ~ /^[0-9]+$/ && ("sm" in col) { n++; sm += $col["sm"]; if (("fb" in col) && $col["fb"] > fb) fb = $col["fb"] }
         END { if (n) printf "   GPU: %d s sampled, mean SM use %.0f%%, most memory used %d MiB\n", n, sm / n, fb }' \
        "$out/$name.dmon" >> "$summary"
}

comfy=(--comfyui .gpu/comfyui --comfyui-python python3)
# SD1.5, 512x512, batch 1: every weft variant and both ComfyUI modes, images kept.
bench sd15-b1-f16 240 --family sd15 --size 512 --label f16- "${comfy[@]}" --comfyui-args= --comfyui-args=--force-fp32
WEFT_PRECISION=bfloat16 bench sd15-b1-bf16 60 --family sd15 --size 512 --label bf16-
WEFT_CUDA_ATTENTION=flash bench sd15-b1-f16-flash 60 --family sd15 --size 512 --label f16flash-
WEFT_PRECISION=float32 bench sd15-b1-f32 60 --family sd15 --size 512 --label f32-
# SD1.5 at batch 4, weft float16 and ComfyUI's default.
bench sd15-b4-f16 150 --family sd15 --size 512 --batch 4 --label f16- "${comfy[@]}" --comfyui-args=
note "diffusers sd15"
timeout 150 python3 scripts/bench-diffusers.py --family sd15 --dtype float16 --size 512 --batch 1,4 --steps 20 --rounds 3 \
    > "$out/diffusers-sd15.log" 2>&1
grep -E '^#' "$out/diffusers-sd15.log" | sed 's/^/   /' >> "$summary"

note "image differences (mean and max over RGB values, 0-255)"
python3 - "$out/images" <<'PY' | tee -a "$summary"
import os, sys
import numpy as np
from PIL import Image
folder = sys.argv[1]
images = {name[:-4]: np.asarray(Image.open(os.path.join(folder, name)).convert("RGB"), dtype=np.int16)
          for name in sorted(os.listdir(folder)) if name.endswith(".png")}
comfy16, comfy32 = "f16-comfyui-sd15-512-b1", "f16-comfyui-force-fp32-sd15-512-b1"
pairs = [(comfy16, comfy32, "ComfyUI float16 vs its float32 (the tolerance)"),
         ("f16-weft-sd15-512-b1", comfy16, "weft float16 vs ComfyUI float16"),
         ("f16-weft-sd15-512-b1", comfy32, "weft float16 vs ComfyUI float32"),
         ("f16flash-weft-sd15-512-b1", comfy16, "weft float16 (flash attention) vs ComfyUI float16"),
         ("bf16-weft-sd15-512-b1", comfy16, "weft bfloat16 vs ComfyUI float16"),
         ("f32-weft-sd15-512-b1", comfy32, "weft float32 vs ComfyUI float32"),
         ("f16-weft-sd15-512-b4", "f16-comfyui-sd15-512-b4", "batch 4: weft float16 vs ComfyUI float16")]
for a, b, what in pairs:
    if a in images and b in images and images[a].shape == images[b].shape:
        d = np.abs(images[a] - images[b])
        print(f"   {what}: mean {d.mean():.3f}, max {d.max()}, values differing {100 * (d > 0).mean():.2f}%")
    else:
        print(f"   {what}: missing ({a in images}, {b in images})")
PY

# SDXL, 1024x1024.
bench sdxl-b1-f16 200 --family sdxl --size 1024 --label f16- "${comfy[@]}" --comfyui-args=
note "diffusers sdxl"
timeout 120 python3 scripts/bench-diffusers.py --family sdxl --dtype float16 --size 1024 --batch 1,4 --steps 20 --rounds 2 \
    > "$out/diffusers-sdxl.log" 2>&1
grep -E '^#' "$out/diffusers-sdxl.log" | sed 's/^/   /' >> "$summary"
bench sdxl-b4-f16 90 --family sdxl --size 1024 --batch 4 --label f16-
note done
