#!/usr/bin/env bash
# Assembles what `cargo build --release --features cuda` needs from NVIDIA's PyPI wheels, on a
# machine with no GPU and no CUDA toolkit: nvcc 13.0 and its headers (candle's kernels are
# compiled at build time) and the libraries the binary links against (cudart, cuBLAS, cuRAND).
# The driver's libcuda is not on PyPI: a link-time stub stands in for it (and for NVRTC, which
# candle links but weft never calls), and the machine that runs the binary supplies the real
# libraries.
#
#     eval "$(scripts/cuda-toolkit.sh [DIR])"   # DIR defaults to ~/.cache/weft/cuda-13.0
#     cargo build --release -p weft --features cuda
#
# It prints the environment for the build: CUDA_ROOT, PATH, LIBRARY_PATH and
# CUDA_COMPUTE_CAP (90, Hopper, unless already set). At run time the GPU machine needs
# the same major version's libcudart.so.13, libcublas.so.13, libcublasLt.so.13,
# libnvrtc.so.13 and libcurand.so.10 on its library path (PyTorch's cu13 wheels carry them).
set -euo pipefail

dir=${1:-${WEFT_CACHE_DIR:-$HOME/.cache/weft}/cuda-13.0}
root=$dir/nvidia/cu13
if [ ! -x "$root/bin/nvcc" ]; then
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
    for package in "nvidia-cuda-nvcc>=13.0,<13.1" "nvidia-cuda-crt>=13.0,<13.1" "nvidia-nvvm>=13.0,<13.1" \
        "nvidia-cuda-cccl>=13.0,<13.1" "nvidia-cuda-runtime>=13.0,<13.1" "nvidia-cublas>=13.0,<13.1" \
        "nvidia-curand>=10.4,<10.5"; do
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
            -d "$wheels" "$package" >&2
    done
    mkdir -p "$dir"
    for wheel in "$wheels"/*.whl; do
        python3 -m zipfile -e "$wheel" "$dir" >&2
    done
    chmod +x "$root"/bin/* "$root"/nvvm/bin/*
    (
        cd "$root/lib"
        for name in cudart cublas cublasLt; do ln -sf "lib$name.so.13" "lib$name.so"; done
        ln -sf libcurand.so.10 libcurand.so
        # Every driver entry point named in cuda.h, each failing with CUDA_ERROR_UNKNOWN:
        # enough to link against, never loaded where a real driver is installed.
        mkdir -p stubs
        grep -oE '\bcu[A-Z][A-Za-z0-9_]*' ../include/cuda.h | sort -u \
            | awk '{ print "int " $1 "(void) { return 999; }" }' > stubs/libcuda.c
        cc -shared -fPIC -o stubs/libcuda.so stubs/libcuda.c -Wl,-soname,libcuda.so.1
        ln -sf stubs/libcuda.so libcuda.so
    )
    ln -sfn lib "$root/lib64"
fi
if [ ! -e "$root/lib/libnvrtc.so" ]; then
    # NVRTC is linked the same way: a stub with every entry point cudarc binds, read from its
    # sources. The machine that runs the binary has the real libnvrtc.so.13.
    find_bindings() { ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/nvrtc/sys/mod.rs 2>/dev/null | tail -1; }
    bindings=$(find_bindings)
    [ -n "$bindings" ] || { cargo fetch --locked >&2; bindings=$(find_bindings); }
    mkdir -p "$root/lib/stubs"
    grep -oE 'pub unsafe fn nvrtc[A-Za-z0-9_]*' "$bindings" | sort -u \
        | awk '{ print "int " $4 "(void) { return 999; }" }' > "$root/lib/stubs/libnvrtc.c"
    cc -shared -fPIC -o "$root/lib/stubs/libnvrtc.so" "$root/lib/stubs/libnvrtc.c" -Wl,-soname,libnvrtc.so.13
    ln -sf stubs/libnvrtc.so "$root/lib/libnvrtc.so"
fi
echo "export CUDA_ROOT='$root' PATH='$root/bin':\"\$PATH\" LIBRARY_PATH='$root/lib'${LIBRARY_PATH:+:\$LIBRARY_PATH} CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}"
