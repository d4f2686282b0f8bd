#!/usr/bin/env bash
# Runs black-box tests against the PostgreSQL store: every server a test starts gets a fresh
# database on a throw-away cluster (see tests/support/postgres.rs). The store and scale-out
# tests use PostgreSQL in the ordinary run already.
#
# By default it runs the tests whose behaviour depends on the store: the job API, event
# streams, recovery, ComfyUI's protocol (its /ws follows every job), the dashboard (its live
# list follows every job) and the CLI. CI runs it after the README's test command. Extra
# arguments go to nextest instead (e.g. `-E 'binary(nodes)'`).
set -euo pipefail
cd "$(dirname "$0")/.."
filter='binary(job_api) | binary(events) | binary(recovery) | binary(comfy_protocol) | binary(dashboard) | binary(cli)'
if [ $# -gt 0 ]; then
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast "$@"
else
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast -E "$filter"
fi
