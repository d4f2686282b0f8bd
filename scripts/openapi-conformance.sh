#!/usr/bin/env bash
# Schemathesis (property-based API testing, from PyPI) against the OpenAPI document a fresh
# `weft serve` publishes at /api/v2/openapi.json: no request may make a 5xx, and every
# response must match the document (status, headers, body). CI runs it after the tests.
#
#   scripts/openapi-conformance.sh [path/to/weft]     (default: target/debug/weft)
#
# Settings: tests/schemathesis.toml. The seed is fixed so that a run is reproducible; set
# SCHEMATHESIS_SEED to explore others.
set -euo pipefail
cd "$(dirname "$0")/.."
weft=${1:-target/debug/weft}
venv=${SCHEMATHESIS_VENV:-target/schemathesis-venv}
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "4.32.5"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet schemathesis==4.32.5
fi
data=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$weft" serve --addr "127.0.0.1:$port" --data-dir "$data" >"$data/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/healthz" | grep -q '"ready":true' && break
  sleep 0.1
done
"$venv/bin/schemathesis" --config-file tests/schemathesis.toml run \
  "http://127.0.0.1:$port/api/v2/openapi.json" \
  --max-examples 50 --request-timeout 20 --seed "${SCHEMATHESIS_SEED:-20261124}" --no-color
