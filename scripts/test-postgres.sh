#!/usr/bin/env bash
# Runs black-box tests against the PostgreSQL store: every server a test starts gets a fresh
# database on a throw-away cluster (see tests/support/postgres.rs). The store and scale-out
# tests use PostgreSQL in the ordinary run already.
#
# By default it runs the job API, event-stream and recovery tests. Known failures: after
# today's merges the event-stream tests hang on PostgreSQL, and the dashboard's live list and
# ComfyUI's /ws follow a per-process channel that the shared event log does not feed, so CI
# does not run this yet. Extra arguments go to nextest instead (e.g. `--test nodes`).
set -euo pipefail
cd "$(dirname "$0")/.."
filter='binary(job_api) | binary(events) | binary(recovery)'
if [ $# -gt 0 ]; then
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast "$@"
else
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast -E "$filter"
fi
