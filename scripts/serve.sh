#!/usr/bin/env bash
# Builds weft (the built-in plugins are compiled to wasm and embedded by the build) and
# starts `weft serve` on 127.0.0.1:8188 with the embedded defaults: SQLite and blobs in
# ./data, built-in plugins. Extra arguments go to `weft serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec cargo run --release -p weft -- serve --addr 127.0.0.1:8188 --data-dir ./data "$@"
