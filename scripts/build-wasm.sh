#!/usr/bin/env bash
# Builds weft's WebAssembly plugins (components for wasm32-wasip2).
#
#   scripts/build-wasm.sh [builtin|test|python|all]     (default: all)
#
#   builtin  plugins/ workspace       -> target/wasm/wasm32-wasip2/release/weft_plugin_*.wasm
#   test     tests/plugins/ workspace -> target/wasm/wasm32-wasip2/release/weft_test_*.wasm
#   python   plugins/python-example   -> target/wasm/python/weft_python_example.wasm
#
# Safe to run concurrently (cargo locks its target directory; the Python component is
# written to a temporary file and moved into place). Prints the paths it produced.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WASM_DIR="$ROOT/target/wasm"
TARGET=wasm32-wasip2
COMPONENTIZE_PY_VERSION=0.17.2
what="${1:-all}"

case "$what" in
  builtin | test | python | all) ;;
  -h | --help)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: $0 [builtin|test|python|all]" >&2
    exit 2
    ;;
esac

# Settings of an outer cargo (this script may run from a build script or a test) must
# not leak into the guest builds.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_TARGET RUSTC_WORKSPACE_WRAPPER \
  RUSTC_WRAPPER CARGO_TARGET_DIR CARGO_MAKEFLAGS CARGO_PRIMARY_PACKAGE CARGO_BUILD_RUSTFLAGS

ensure_target() {
  if command -v rustup >/dev/null 2>&1 \
    && ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    rustup target add "$TARGET"
  fi
}

# Builds one cargo workspace and prints the .wasm files of its cdylib crates.
build_workspace() {
  local manifest="$1"
  ensure_target
  cargo build --release --target "$TARGET" --manifest-path "$manifest" --target-dir "$WASM_DIR"
  local crate
  for crate in $(cargo metadata --no-deps --format-version 1 --manifest-path "$manifest" \
    | python3 -c 'import json,sys; print("\n".join(p["name"] for p in json.load(sys.stdin)["packages"]))'); do
    echo "built: $WASM_DIR/$TARGET/release/${crate//-/_}.wasm"
  done
}

build_python() {
  if ! command -v componentize-py >/dev/null 2>&1 \
    || [ "$(componentize-py --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
    python3 -m pip install --quiet "componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
  local out_dir="$WASM_DIR/python"
  local out="$out_dir/weft_python_example.wasm"
  mkdir -p "$out_dir"
  local tmp
  tmp="$(mktemp "$out_dir/.weft_python_example.XXXXXX.wasm")"
  trap 'rm -f "$tmp"' RETURN
  componentize-py -d "$ROOT/wit/weft-node-0.1.0" -w plugin componentize app \
    -p "$ROOT/plugins/python-example" -o "$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$out"
  echo "built: $out"
}

case "$what" in
  builtin) build_workspace "$ROOT/plugins/Cargo.toml" ;;
  test) build_workspace "$ROOT/tests/plugins/Cargo.toml" ;;
  python) build_python ;;
  all)
    build_workspace "$ROOT/plugins/Cargo.toml"
    build_workspace "$ROOT/tests/plugins/Cargo.toml"
    build_python
    ;;
esac
