#!/usr/bin/env bash
# Runs black-box tests against the PostgreSQL store: every server a test starts gets a fresh
# database on a throw-away cluster (see tests/support/postgres.rs). The store and scale-out
# tests use PostgreSQL in the ordinary run already.
#
# By default it runs the tests whose behaviour depends on the store: the job API, event
# streams, recovery, graceful shutdown, ComfyUI's protocol (its /ws follows every job), the
# dashboard (its live list follows every job), the CLI, the graph engine (cache, outputs,
# failures), branches, bounds, assets, content safety, host limits and blobs in S3. CI runs
# it after the README's test command. Extra arguments go to nextest instead (e.g.
# `-E 'binary(nodes)'`); the other black-box tests pass there too (the SQLite-only disk-full
# test of `health` skips itself).
set -euo pipefail
cd "$(dirname "$0")/.."
filter='binary(job_api) | binary(events) | binary(recovery) | binary(shutdown) | binary(comfy_protocol) | binary(dashboard) | binary(cli) | binary(graph) | binary(branches) | binary(bounds) | binary(assets) | binary(content_safety) | binary(host_limits) | binary(blob_store)'
if [ $# -gt 0 ]; then
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast "$@"
else
  WEFT_TEST_STORE=postgres cargo nextest run --workspace --no-fail-fast -E "$filter"
fi
