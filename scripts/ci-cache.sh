#!/usr/bin/env bash
# Sourced by .ci/run: points this clone's build directories (target/debug, target/wasm,
# fuzz/target) and the test tools' virtual environments at a cache that outlives the clone
# (WEFT_CI_CACHE, default ~/.cache/weft-ci). A directory that already exists in the clone is
# left as it is.
cache="${WEFT_CI_CACHE:-$HOME/.cache/weft-ci}"
# Cargo never deletes old builds; each run adds its own crates'. Past 40 GiB (or with less
# than 20 GiB left on the disk) the cache starts over.
if [ -d "$cache" ]; then
  used_kib=$(du -sk "$cache" | cut -f1)
  free_kib=$(df -Pk "$(dirname "$cache")" | awk 'NR == 2 {print $4}')
  if [ "$used_kib" -gt $((40 << 20)) ] || [ "$free_kib" -lt $((20 << 20)) ]; then
    echo "ci-cache: clearing $cache (${used_kib} KiB used, ${free_kib} KiB free)"
    rm -rf "$cache"
  fi
fi
mkdir -p "$cache/debug" "$cache/wasm" "$cache/fuzz-target" target
for link in target/debug:debug target/wasm:wasm fuzz/target:fuzz-target; do
  path=${link%%:*}
  if [ ! -e "$path" ] || [ -L "$path" ]; then
    ln -sfn "$cache/${link#*:}" "$path"
  fi
done
export SCHEMATHESIS_VENV="$cache/schemathesis-venv"
export COMFY_CLIENT_VENV="$cache/comfy-client-venv"
export MOTO_VENV="$cache/moto-venv"
