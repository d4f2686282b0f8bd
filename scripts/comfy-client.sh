#!/usr/bin/env bash
# Installs comfy-api-simplified, a ComfyUI protocol client from PyPI (not ours), into a
# virtual environment under target/, for the test that runs it against weft unchanged.
# Safe to run again: it does nothing when the pinned version is there. Prints the
# environment's python.
#
#   scripts/comfy-client.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${COMFY_CLIENT_VENV:-target/comfy-client-venv}
version=1.6.0
if ! "$venv/bin/pip" show comfy-api-simplified 2>/dev/null | grep -qx "Version: $version"; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "comfy-api-simplified==$version" >&2
fi
echo "$venv/bin/python"
