#!/usr/bin/env bash
# Runs the whole test suite: unit tests and the black-box tests in tests/, which start the
# real `weft` binary. Builds the wasm plugins (built-in, hostile test plugins, and the Python
# and JavaScript examples) first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --with-tests --with-python --with-js
./scripts/build-wasm.sh all
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
