#!/usr/bin/env bash
# Installs what weft needs on a fresh Debian machine. With no option, what serving needs and
# no more: the wasm32-wasip2 Rust target (to build the plugins), ffmpeg and a General MIDI
# SoundFont (video-to-music). Options add:
#   --with-tests   what only the tests use: PostgreSQL's server binaries (the tests start
#                  throw-away clusters; no server is left running), Chromium with its
#                  WebDriver (the browser tests), and comfy-api-simplified from PyPI in a venv
#                  under target/ (the ComfyUI protocol tests);
#   --with-python  componentize-py (the Python example plugin), and moto's S3 server in a
#                  venv under target/ (the S3 blob store tests);
#   --with-js      Node.js, npm and the pinned componentize-js/jco of scripts/js-toolchain
#                  (the JavaScript example plugin), installed into target/js-toolchain;
#   --with-fuzz    cargo-fuzz (the fuzz targets in fuzz/).
# Safe to run again: it skips what is there.
set -euo pipefail

with_tests=false
with_python=false
with_js=false
with_fuzz=false
for arg in "$@"; do
  case "$arg" in
    --with-tests) with_tests=true ;;
    --with-python) with_python=true ;;
    --with-js) with_js=true ;;
    --with-fuzz) with_fuzz=true ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

missing=()
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
if $with_js; then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
[ -f /usr/share/sounds/sf2/TimGM6mb.sf2 ] || missing+=(timgm6mb-soundfont)
if $with_tests; then
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
fi
if $with_tests || $with_python; then
  python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  # The package starts a cluster of its own; the tests never use it.
  if [[ " ${missing[*]} " == *" postgresql "* ]] && command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version name _; do
      $SUDO pg_ctlcluster "$version" "$name" stop 2>/dev/null || true
    done
  fi
fi

if $with_python && ! command -v componentize-py >/dev/null 2>&1; then
  python3 -m pip install --quiet componentize-py==0.17.2
fi
# moto's S3 server, in a venv under target/ (the S3 blob store tests, tests/blob_store.rs).
if $with_python; then
  "$(dirname "$0")/moto.sh" >/dev/null
fi

if $with_js; then
  "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/js-toolchain/install.sh"
fi

# cargo-fuzz drives libFuzzer; on stable rustc it runs with RUSTC_BOOTSTRAP=1 (scripts/fuzz.sh).
if $with_fuzz && ! cargo fuzz --version 2>/dev/null | grep -q "0\.13\.1"; then
  cargo install --locked cargo-fuzz --version 0.13.1
fi

# comfy-api-simplified, the PyPI ComfyUI client the protocol tests run (in target/).
if $with_tests; then
  "$(dirname "$0")/comfy-client.sh" >/dev/null
fi
