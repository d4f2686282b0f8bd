#!/usr/bin/env bash
# Runs black-box tests against the PostgreSQL store: every server a test starts gets a fresh
# database on a throw-away cluster (see tests/support/postgres.rs). The store and scale-out
# tests use PostgreSQL in the ordinary run already.
#
# By default it runs the test files shown to pass on PostgreSQL: the job API, event streams
# and recovery. The rest of the black-box suite has not been shown to pass there yet; in
# particular the dashboard's live list and ComfyUI's /ws follow a per-process channel that the
# shared event log does not feed. Extra arguments go to nextest instead (e.g. `--test nodes`).
set -euo pipefail
cd "$(dirname "$0")/.."
filter='binary(job_api) | binary(events) | binary(recovery)'
if [ $# -gt 0 ]; then
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast "$@"
else
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast -E "$filter"
fi
