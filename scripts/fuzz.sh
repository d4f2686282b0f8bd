#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ (cargo-fuzz, libFuzzer) and runs each for a short time,
# starting from its seeds (fuzz/seeds/<target>). A crash stops the run with the input under
# fuzz/artifacts/<target>/: fix it, then copy the input to fuzz/regressions/<target>/, where
# `cargo test --test fuzz_regressions` replays it for good.
#
#   ./scripts/fuzz.sh                 # every target, 30 s each (CI)
#   ./scripts/fuzz.sh 600 workflow    # one target, 10 minutes
#   FUZZ_SEED=1 ./scripts/fuzz.sh 20  # a fixed seed: the same inputs in the same order (CI)
#
# Only stable rustc is needed: RUSTC_BOOTSTRAP=1 lets it take libFuzzer's instrumentation
# flags. No sanitizer (`-s none`): the code is safe Rust, and what is looked for is panics
# (debug assertions and overflow checks are on) and runaway time or memory.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
./scripts/setup.sh --with-fuzz
export RUSTC_BOOTSTRAP=1
cd fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
cargo fuzz build -s none --debug-assertions
seed=()
if [ -n "${FUZZ_SEED:-}" ]; then
  seed=(-seed="$FUZZ_SEED")
fi
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  cargo fuzz run -s none --debug-assertions "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=3072 -max_len=1048576 -print_final_stats=1 "${seed[@]}"
done
