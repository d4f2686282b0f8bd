#!/usr/bin/env bash
# Installs moto's S3-compatible server from PyPI (not ours) into a virtual environment under
# target/, for the tests that run weft with its blobs in S3 (tests/blob_store.rs). Safe to
# run again: it does nothing when the pinned version is there. Prints the path of the
# environment's moto_server.
#
#   scripts/moto.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MOTO_VENV:-target/moto-venv}
version=5.2.5
if ! "$venv/bin/pip" show moto 2>/dev/null | grep -qx "Version: $version"; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "moto[server]==$version" >&2
fi
echo "$venv/bin/moto_server"
