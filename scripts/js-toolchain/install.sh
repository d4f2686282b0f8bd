#!/usr/bin/env bash
# Installs the JavaScript plugin toolchain pinned by package-lock.json here (componentize-js
# and jco from the npm registry) into target/js-toolchain with `npm ci`. A no-op when the
# installed lock file is this one. Needs node and npm (scripts/setup.sh --with-js adds them).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="$HERE/../../target/js-toolchain"
if cmp -s "$HERE/package-lock.json" "$DEST/node_modules/.package-lock-source.json" 2>/dev/null \
  && [ -x "$DEST/node_modules/.bin/componentize-js" ]; then
  exit 0
fi
mkdir -p "$DEST"
cp "$HERE/package.json" "$HERE/package-lock.json" "$DEST/"
# `npm install` over the lock file, not `npm ci`: npm 9 rejects a lock that lacks the
# optional native packages of other platforms (a known npm bug), and this lock was made on one.
(cd "$DEST" && npm install --no-audit --no-fund --loglevel=error)
cp "$HERE/package-lock.json" "$DEST/node_modules/.package-lock-source.json"
