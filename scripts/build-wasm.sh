#!/usr/bin/env bash
# Builds weft's WebAssembly plugins (components for wasm32-wasip2).
#
#   scripts/build-wasm.sh [builtin|test|python|js|all]     (default: all)
#
#   builtin  plugins/ workspace       -> target/wasm/wasm32-wasip2/release/weft_plugin_*.wasm
#   test     tests/plugins/ workspace -> target/wasm/wasm32-wasip2/release/weft_test_*.wasm
#   python   plugins/python-example   -> target/wasm/python/weft_python_example.wasm
#   js       plugins/js-example       -> target/wasm/js/weft_js_example.wasm
#
# Safe to run concurrently (cargo locks its target directory; the Python and JS components are
# written to a temporary file and moved into place). Prints the paths it produced.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WASM_DIR="$ROOT/target/wasm"
TARGET=wasm32-wasip2
COMPONENTIZE_PY_VERSION=0.17.2
what="${1:-all}"

case "$what" in
  builtin | test | python | js | all) ;;
  -h | --help)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: $0 [builtin|test|python|js|all]" >&2
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

# Builds plugins/js-example with componentize-js (installed by scripts/js-toolchain/install.sh)
# against the 0.2.0 world. componentize-js reads modules relative to the working directory,
# so it runs from the repository root: the example imports sdk/js/weft.js by relative path.
# The outbound-HTTP parts of its runtime are left out: the host grants plugins no HTTP.
build_js() {
  "$ROOT/scripts/js-toolchain/install.sh"
  local out_dir="$WASM_DIR/js"
  local out="$out_dir/weft_js_example.wasm"
  mkdir -p "$out_dir"
  # Global, so the EXIT trap still sees it when a failed build ends the script.
  js_tmp="$(mktemp "$out_dir/.weft_js_example.XXXXXX.wasm")"
  trap 'rm -f "$js_tmp"' EXIT
  (cd "$ROOT" && target/js-toolchain/node_modules/.bin/componentize-js plugins/js-example/plugin.js \
    --wit wit/weft-node-0.2.0 --world-name plugin --disable http fetch-event --out "$js_tmp" >/dev/null)
  chmod 644 "$js_tmp"
  mv -f "$js_tmp" "$out"
  echo "built: $out"
}

case "$what" in
  builtin) build_workspace "$ROOT/plugins/Cargo.toml" ;;
  test) build_workspace "$ROOT/tests/plugins/Cargo.toml" ;;
  python) build_python ;;
  js) build_js ;;
  all)
    build_workspace "$ROOT/plugins/Cargo.toml"
    build_workspace "$ROOT/tests/plugins/Cargo.toml"
    build_python
    build_js
    ;;
esac
