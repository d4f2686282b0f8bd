#!/usr/bin/env bash
# Runs the black-box tests against the PostgreSQL store: every server a test starts gets a
# fresh database on a throw-away cluster (see tests/support/postgres.rs). The SD1.5 parity
# tests are left out (they exercise the numeric core, not the store, and are slow), as are
# the store and scale-out tests, which use PostgreSQL in the ordinary run already, and the
# plugin-authoring and fuzz-regression tests, which start no server whose store matters.
# Extra arguments go to nextest (e.g. `--test job_api`).
set -euo pipefail
cd "$(dirname "$0")/.."
filter='kind(test) and not binary(parity) and not binary(store) and not binary(scaleout)
  and not binary(plugin_authoring) and not binary(fuzz_regressions)'
if [ $# -gt 0 ]; then
  WEFT_TEST_STORE=postgres cargo nextest run -p weft --no-fail-fast "$@"
else
  WEFT_TEST_STORE=postgres cargo nextest run -p weft --no-fail-fast -E "$filter"
fi
